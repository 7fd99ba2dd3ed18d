#include "lns/model/block_plan.h"

#include <algorithm>
#include <cmath>

#include "lns/model/layer_schemes.h"
#include "lns/core/rng.h"

namespace lns {

const char* norm_slot_name(NormSlot s) {
  switch (s) {
    case NormSlot::InputLayernorm: return "input_layernorm";
    case NormSlot::PostAttentionLayernorm: return "post_attention_layernorm";
    case NormSlot::PreFeedforwardLayernorm: return "pre_feedforward_layernorm";
    case NormSlot::PostFeedforwardLayernorm: return "post_feedforward_layernorm";
  }
  return "?";
}

std::vector<NormSlot> BlockPlan::norms() const {
  std::vector<NormSlot> out;
  std::vector<const SublayerPlan*> subs{&attn, &mlp};
  if (route) subs.insert(subs.end(), {&route->attn, &route->mlp});
  for (const SublayerPlan* sp : subs)
    for (const auto& slot : {sp->pre_norm, sp->out_norm, sp->add_norm})
      if (slot && std::find(out.begin(), out.end(), *slot) == out.end()) out.push_back(*slot);
  return out;
}

float gate_noise(uint64_t seed, int global_layer, uint64_t sample, int k) {
  const uint64_t key = rng_key(seed, "gate_noise." + std::to_string(global_layer));
  const uint64_t bits = splitmix64(key ^ splitmix64(2 * sample + static_cast<uint64_t>(k)));
  const double u = (static_cast<double>(bits >> 11) + 0.5) * 0x1p-53;  // strictly inside (0, 1)
  return static_cast<float>(-std::log(-std::log(u)));
}

float lns_scale(int global_layer) { return 1.0f / std::sqrt(static_cast<float>(global_layer + 1)); }

std::string branch_scale_name(int global_layer, int sublayer) {
  return "model.layers." + std::to_string(global_layer) +
         (sublayer == 0 ? ".raw_scaling_factor_attn" : ".raw_scaling_factor_mlp");
}

BlockPlan block_plan(const LlamaConfig& cfg, int global_layer) {
  // Depth, not position: a block keeps the depth it was trained at (layer removal).
  const int depth = cfg.depth_of(global_layer);
  NormScheme s = cfg.norm_scheme;
  if (s == NormScheme::Mix || s == NormScheme::ScalePostPre)
    s = depth < cfg.post_layers ? NormScheme::Post : NormScheme::Pre;
  if (s == NormScheme::Hybrid) s = resolve_layer_schemes(cfg.layer_schemes, cfg.depth_layers())[depth];
  // mono_reverse's other layers stay MonoReverse: the repository's post layer (below).
  if (s == NormScheme::Mono || s == NormScheme::MonoReverse || s == NormScheme::MonoReverseCorrected)
    s = (depth + 1) % kRouteEvery == 0        ? NormScheme::Routed
        : s == NormScheme::Mono                 ? NormScheme::Pre
        : s == NormScheme::MonoReverseCorrected ? NormScheme::Post
                                                : NormScheme::MonoReverse;
  if (s == NormScheme::Routed) {  // path 0 a Pre-LN block, path 1 a Post-LN block
    LlamaConfig one = cfg;
    one.norm_scheme = NormScheme::Pre;
    BlockPlan p = block_plan(one, global_layer);
    one.norm_scheme = NormScheme::Post;
    const BlockPlan post = block_plan(one, global_layer);
    p.effective = NormScheme::Routed;
    p.route = RoutePlan{post.attn, post.mlp};
    return p;
  }
  BlockPlan p{s, {}, {}, {}};
  switch (s) {
    case NormScheme::Pre:
    case NormScheme::ScaledInit:
    case NormScheme::LNS:
    case NormScheme::ScaleResPre: {
      const float scale = s == NormScheme::LNS ? lns_scale(depth) : 1.0f;
      p.attn.pre_norm = NormSlot::InputLayernorm;
      p.mlp.pre_norm = NormSlot::PostAttentionLayernorm;  // Hugging Face's name for it
      p.attn.pre_scale = p.mlp.pre_scale = scale;
      p.attn.learned_branch_scale = p.mlp.learned_branch_scale = s == NormScheme::ScaleResPre;
      if (cfg.folded_norms) {  // gain, scale and constant live in the linears (lns_convert fold-norms)
        p.attn.pre_norm = p.mlp.pre_norm = std::nullopt;
        p.attn.pre_scale = p.mlp.pre_scale = 1.0f;
      }
      break;
    }
    case NormScheme::Post:
    case NormScheme::DeepNorm:
    case NormScheme::DeepPost:
    case NormScheme::DeepPostCorrected: {
      p.attn.add_norm = NormSlot::PostAttentionLayernorm;
      p.mlp.add_norm = NormSlot::PostFeedforwardLayernorm;
      if (s == NormScheme::DeepNorm)
        p.attn.residual_alpha = p.mlp.residual_alpha =
            static_cast<float>(std::pow(2.0 * cfg.depth_layers(), 0.25));
      if (s == NormScheme::DeepPost || s == NormScheme::DeepPostCorrected)  // the repository's fixed factor
        p.attn.residual_alpha = p.mlp.residual_alpha = static_cast<float>(2.0 * std::sqrt(2.0));
      break;
    }
    case NormScheme::MonoReverse:
      // The repository's mono_reverse post layer: Post-LN, except that the MLP reads
      // post_attention_layernorm's output normalised by the same norm again:
      //   h = N_pa(x + Attn(x));  y = N_pf(h + MLP(N_pa(h)))
      p.attn.add_norm = NormSlot::PostAttentionLayernorm;
      p.mlp.pre_norm = NormSlot::PostAttentionLayernorm;
      p.mlp.add_norm = NormSlot::PostFeedforwardLayernorm;
      break;
    case NormScheme::Sandwich:
      p.attn.pre_norm = NormSlot::InputLayernorm;
      p.attn.out_norm = NormSlot::PostAttentionLayernorm;
      p.mlp.pre_norm = NormSlot::PreFeedforwardLayernorm;
      p.mlp.out_norm = NormSlot::PostFeedforwardLayernorm;
      break;
    case NormScheme::Mix:
    case NormScheme::ScalePostPre:
    case NormScheme::Hybrid:
    case NormScheme::Routed:
    case NormScheme::Mono:
    case NormScheme::MonoReverseCorrected: break;  // resolved above
  }
  return p;
}

float init_std_for(const LlamaConfig& cfg, ParamKind kind, int64_t fan_out, int64_t fan_in, int global_layer) {
  const double L = cfg.num_layers;
  if (kind == ParamKind::Embedding) return cfg.embed_init_std;
  // Xavier-normal block matrices: gain * sqrt(2 / (fan_in + fan_out)); q/k gain 1, v, o,
  // gate, up and down `gain`. DeepNet's gain is (8L)^(-1/4); the reference repository's
  // deeppost draws (8L)^(+1/4) (docs/model.md), deeppost_corrected DeepNet's.
  double gain = 0.0;  // 0: no Xavier rule
  if (cfg.norm_scheme == NormScheme::DeepNorm || cfg.norm_scheme == NormScheme::DeepPostCorrected)
    gain = std::pow(8.0 * L, -0.25);
  if (cfg.norm_scheme == NormScheme::DeepPost) gain = std::pow(8.0 * L, 0.25);
  if (gain > 0.0 && kind >= ParamKind::Q) {
    const bool qk = kind == ParamKind::Q || kind == ParamKind::K;
    return static_cast<float>((qk ? 1.0 : gain) * std::sqrt(2.0 / double(fan_in + fan_out)));
  }
  // o_proj and down_proj at std / sqrt(2L): every layer in scaled_init (the repository's
  // scale_pre), only the Pre-LN layers (depth >= --post_layers) in scale_post_pre.
  const bool scaled = cfg.norm_scheme == NormScheme::ScaledInit ||
                      (cfg.norm_scheme == NormScheme::ScalePostPre && global_layer >= 0 &&
                       cfg.depth_of(global_layer) >= cfg.post_layers);
  if (scaled && (kind == ParamKind::O || kind == ParamKind::Down))
    return static_cast<float>(cfg.init_std / std::sqrt(2.0 * L));
  return cfg.init_std;
}

}  // namespace lns
