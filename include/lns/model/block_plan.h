// The normalization schemes as data. Every sublayer (attention, then MLP) of every
// scheme has the same general form, with input x and sublayer function F:
//
//   u  = s * N_pre(x)         if pre_norm,  else u = x
//   f  = F(u)
//   f2 = N_out(f)             if out_norm (sandwich), else f
//   r  = alpha * x + b * f2   (b a learned scalar in scale_res_pre_norm, else 1)
//   y  = N_add(r)             if add_norm (post, deepnorm), else r
//
// A scheme is a choice of which norms exist, their names, s and alpha; the block code
// (model/stage.cpp) implements only this form. A new scheme is one more case in
// block_plan(), never a fork of the block. All depth-dependent values come from the
// *global* 0-based layer index, so a pipeline stage or a trimmed checkpoint gets the
// same plan for the same layer.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "lns/model/config.h"

namespace lns {

// The four per-layer norm names of Hugging Face LLaMA / Gemma 2.
enum class NormSlot { InputLayernorm, PostAttentionLayernorm, PreFeedforwardLayernorm,
                      PostFeedforwardLayernorm };
const char* norm_slot_name(NormSlot s);  // e.g. "post_attention_layernorm"

struct SublayerPlan {
  std::optional<NormSlot> pre_norm;  // N_pre
  float pre_scale = 1.0f;            // s: 1/sqrt(l) for LNS
  std::optional<NormSlot> out_norm;  // N_out (sandwich)
  float residual_alpha = 1.0f;       // alpha: (2L)^(1/4) for DeepNorm
  // b, the scale of the sublayer's output, is a learned scalar (scale_res_pre_norm, as
  // the reference repository computes it: x + F(N(x)) * a), initialised to
  // kBranchScaleInit: model.layers.{i}.raw_scaling_factor_attn / raw_scaling_factor_mlp
  // (the repository's names; shape [1] here, a 0-dim tensor in its files).
  bool learned_branch_scale = false;
  std::optional<NormSlot> add_norm;  // N_add (post-LN family)
};

// A routed block (mono, mono_reverse; docs/model.md) runs its input x through two
// paths with the same attention and MLP weights, path 0 = (attn, mlp) and path 1 =
// route->(attn, mlp), and mixes them per sequence b with a hard Gumbel-softmax gate of
// a router (model.layers.{i}.router.weight [2, C], ParamKind::Router):
//   gate[b] = onehot(argmax(mean_t(x[b] @ router^T) + g[b]))     g Gumbel noise (0 at eval)
//   y[b]    = gate[b,0] * path0(x)[b] + gate[b,1] * path1(x)[b]  (straight-through gradient)
// A norm slot named in both paths is one parameter used twice.
struct RoutePlan {
  SublayerPlan attn, mlp;  // path 1
};

struct BlockPlan {
  NormScheme effective;  // the scheme this layer runs (Mix-LN resolves to Pre or Post)
  SublayerPlan attn, mlp;
  std::optional<RoutePlan> route;  // routed blocks only
  std::vector<NormSlot> norms() const;  // the norms this block owns, without repeats
};

// mono / mono_reverse route the layers of 0-based depth d with (d + 1) % kRouteEvery == 0.
constexpr int kRouteEvery = 4;

// scale_res_pre_norm's branch scales start here (the repository's nn.Parameter(torch.tensor(0.001))).
constexpr float kBranchScaleInit = 0.001f;
// The name of a layer's learned branch scale, sublayer 0 (attention) or 1 (MLP):
// "model.layers.{i}.raw_scaling_factor_attn" / "..._mlp".
std::string branch_scale_name(int global_layer, int sublayer);

// The training Gumbel noise of gate entry k (0, 1) of sequence `sample` (its index in
// the training stream, counted from the start of the run: the same under any parallel
// layout and after a resume) at routed global layer `global_layer`: -log(-log(u)), u
// uniform in (0, 1) from the counter-based stream rng_key(seed, "gate_noise.<layer>").
float gate_noise(uint64_t seed, int global_layer, uint64_t sample, int k);

// 1/sqrt(l) with l = global_layer + 1.
float lns_scale(int global_layer);
BlockPlan block_plan(const LlamaConfig& cfg, int global_layer);

// Every layer's plan as JSON (src/model/block_plan_json.cpp; lns_train --print_block_plan):
// {"norm_scheme", "num_layers", "post_layers", "layer_schemes", "folded_norms", "layers": [
//  {"layer", "depth", "scheme" (the effective one), "norms" (the slots it owns), "attn",
//   "mlp" (each a SublayerPlan: "pre_norm", "pre_scale", "out_norm", "residual_alpha",
//   "learned_branch_scale", "add_norm"; a slot is its name or null), "route" (null, or
//   path 1's {"attn", "mlp"})}, ...]}. What tools/perf's models read.
nlohmann::json block_plans_json(const LlamaConfig& cfg);

// How a parameter is initialised: normal(0, std). `std` already includes every
// scheme rule (scaled_init's 1/sqrt(2L), the Xavier gains of deepnorm and deeppost).
// BranchScale: a learned branch scale [1] (kBranchScaleInit at init, no weight decay).
// Router: a routed block's router [2, C] (replicated under tensor parallelism, f32 on
// both devices, normal(--init_std), decays like every matrix).
enum class ParamKind { Embedding, LmHead, NormGain, NormBias, BranchScale, Router, Q, K, V, O, Gate, Up, Down };
// `global_layer`: the parameter's layer (ParamInfo::layer), -1 outside the blocks;
// scale_post_pre scales only its Pre-LN layers' o_proj and down_proj.
float init_std_for(const LlamaConfig& cfg, ParamKind kind, int64_t fan_out, int64_t fan_in, int global_layer);

}  // namespace lns
