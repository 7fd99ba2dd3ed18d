// LlamaConfig: the shape and scheme of a model. Built from flags (model_flags.cpp),
// from a checkpoint or golden file's JSON, and validated once in one place.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "lns/core/fp8_recipe.h"
#include "lns/core/ops.h"
#include "lns/model/recompute.h"

namespace lns {

enum class NormScheme {
  Pre, LNS, Post, Mix, Sandwich, DeepNorm, ScaledInit,
  // The reference repository's other variants, as that repository computes them
  // (docs/model.md, with its line numbers):
  DeepPost,      // post with the residual multiplied by a fixed 2*sqrt(2); Xavier gain (8L)^(+1/4)
  ScalePostPre,  // Mix-LN with scaled_init's initialisation in its Pre-LN layers only
  Hybrid,        // a per-layer pattern of block forms (--layer_schemes, lns/model/layer_schemes.h)
  ScaleResPre,   // pre with a learned scale on each sublayer's output: r = x + a * F(N(x)), a = 0.001 at init
  // Gumbel-routed blocks (BlockPlan::route): the block runs as Pre-LN and as Post-LN on
  // the same weights and a per-sequence hard Gumbel-softmax gate picks one.
  Routed,        // every layer routed (a block form, also usable in --layer_schemes)
  Mono,          // pre, with every 4th layer (0-based 3, 7, ...) routed
  MonoReverse,   // post (post_attention_layernorm applied twice, as the repository does), every 4th layer routed
  // Corrected forms of two repository slips (docs/model.md): their own names, so the
  // repository's names keep computing what the repository computes.
  DeepPostCorrected,     // deeppost with DeepNet's Xavier gain (8L)^(-1/4)
  MonoReverseCorrected,  // mono_reverse whose post layers normalise once (plain Post-LN)
};

// "pre", "lns", "post", "mix", "sandwich", "deepnorm", "scaled_init", "deeppost",
// "scale_post_pre", "hybrid", "scale_res_pre_norm", "routed", "mono", "mono_reverse",
// "deeppost_corrected", "mono_reverse_corrected"
const char* norm_scheme_name(NormScheme s);
// Every scheme's name, in the table's order (what --norm_scheme accepts).
std::vector<std::string> norm_scheme_names();
// Throws UserError naming `flag` and the accepted values.
NormScheme parse_norm_scheme(const std::string& s, const std::string& flag = "--norm_scheme");
const char* norm_type_name(NormType t);  // "rmsnorm", "layernorm"
NormType parse_norm_type(const std::string& s, const std::string& flag = "--norm_type");

// Bounds of a model that keep every size product inside int64 and every allocation
// sane; a config (flags or a file's) beyond them is refused by validate().
constexpr int64_t kMaxModelDim = int64_t{1} << 24;          // vocabulary, widths, heads
constexpr int kMaxLayers = 4096;
constexpr int64_t kMaxTensorElements = int64_t{1} << 36;    // per weight matrix
constexpr int64_t kMaxModelParams = int64_t{1} << 40;

struct LlamaConfig {
  int vocab_size = 32000;
  int hidden_size = 768;
  int intermediate_size = 2048;
  int num_layers = 12;
  int num_heads = 12;
  int num_kv_heads = 12;
  double rope_theta = 10000.0;
  float norm_eps = 1e-5f;
  NormType norm_type = NormType::RMSNorm;
  NormScheme norm_scheme = NormScheme::LNS;
  // Mix-LN, scale_post_pre: layers with 0-based index < post_layers are Post-LN. 1 by
  // default, as the reference repository's POST_NUM (docs/model.md).
  int post_layers = 1;
  std::string layer_schemes;  // hybrid: the per-layer pattern (lns/model/layer_schemes.h)
  bool tie_embeddings = false;
  float init_std = 0.02f;
  float embed_init_std = 0.02f;
  // The depth each block was trained at, when it differs from its position (a model
  // with layers removed keeps its blocks' LNS scales and Mix-LN roles): layer i runs
  // as 0-based depth layer_depths[i] of a model of trained_num_layers layers. Empty /
  // 0: the identity and num_layers.
  std::vector<int> layer_depths;
  int trained_num_layers = 0;
  // The norms are folded away (lns_convert fold-norms, docs/ln_free.md): an LN-free
  // model whose every pre-norm and final norm divided by one constant had each norm's
  // gain, depth scale and constant multiplied into the linears it feeds. The blocks run
  // their pre-norm scheme without the norms (block_plan: no pre-norm, scale 1) and the
  // head reads the residual stream directly. Only pre-norm schemes, RMSNorm, untied.
  bool folded_norms = false;
  // How attention runs on CUDA (--attention): an execution choice, not a property of
  // the weights, so not in to_json(); the stage resolves it once (choose_attention_impl).
  AttentionImpl attention = AttentionImpl::Auto;
  // Activation recomputation (--recompute, --recompute_layers; lns/model/recompute.h): also an
  // execution choice, not in to_json(). recompute_layers: full only, 0 = every layer.
  RecomputeMode recompute = RecomputeMode::None;
  int recompute_layers = 0;
  // FP8 linear layers (--fp8, --fp8_amax_history, --fp8_margin, --fp8_amax_compute: the
  // recipe, lns/core/fp8_recipe.h): how the q/k/v/o and gate/up/down GEMMs run, an
  // execution choice like attention, not in to_json().
  Fp8Mode fp8 = Fp8Mode::None;
  Fp8ScalingConfig fp8_scaling;

  int head_dim() const { return hidden_size / num_heads; }
  int depth_of(int layer) const { return layer_depths.empty() ? layer : layer_depths[layer]; }
  int depth_layers() const { return trained_num_layers > 0 ? trained_num_layers : num_layers; }
  int kv_dim() const { return num_kv_heads * head_dim(); }
  // Every constraint the model relies on; UserError naming the offending flag.
  void validate() const;
  nlohmann::json to_json() const;
  // Keys as the flags (vocab_size, ...); missing keys keep their defaults. Every
  // field is type- and range-checked and the result validated; UserError naming
  // `source` (the file, and where in it) and the field.
  static LlamaConfig from_json(const nlohmann::json& j, const std::string& source);
};

}  // namespace lns
