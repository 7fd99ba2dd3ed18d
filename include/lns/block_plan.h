// The normalization schemes as data. Every sublayer (attention, then MLP) of every
// scheme has the same general form, with input x and sublayer function F:
//
//   u  = s * N_pre(x)         if pre_norm,  else u = x
//   f  = F(u)
//   f2 = N_out(f)             if out_norm (sandwich), else f
//   r  = alpha * x + f2       (alpha a learned scalar in scale_res_pre_norm)
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

#include "lns/config.h"

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
  // alpha is instead a learned scalar parameter (scale_res_pre_norm), initialised to 1:
  // model.layers.{i}.self_attn.residual_scale / mlp.residual_scale, shape [1].
  bool learnable_alpha = false;
  std::optional<NormSlot> add_norm;  // N_add (post-LN family)
};

struct BlockPlan {
  NormScheme effective;  // the scheme this layer runs (Mix-LN resolves to Pre or Post)
  SublayerPlan attn, mlp;
  std::vector<NormSlot> norms() const;  // the norms this block owns, without repeats
};

// 1/sqrt(l) with l = global_layer + 1.
float lns_scale(int global_layer);
BlockPlan block_plan(const LlamaConfig& cfg, int global_layer);

// How a parameter is initialised: normal(0, std). `std` already includes every
// scheme rule (scaled_init's 1/sqrt(2L), DeepNorm's Xavier gains).
// ResidualScale: a learnable residual scale [1] (initialised to 1, no weight decay).
enum class ParamKind { Embedding, LmHead, NormGain, NormBias, ResidualScale, Q, K, V, O, Gate, Up, Down };
float init_std_for(const LlamaConfig& cfg, ParamKind kind, int64_t fan_out, int64_t fan_in);

}  // namespace lns
