// Which parameters a LlamaStage registers (its layers' norms and linears by the block
// plan, the embedding, the final norm, the head; each as its tensor-parallel shard) and
// their initial values. The checkpoint names and the flat layout come from here.
#include <cmath>

#include "lns/core/errors.h"
#include "lns/core/rng.h"
#include "stage_types.h"

namespace lns {

void LlamaStage::register_params() {
  const int64_t C = cfg_.hidden_size, F = cfg_.intermediate_size,
                QD = int64_t{cfg_.num_heads} * cfg_.head_dim(), KD = cfg_.kv_dim(),
                V = cfg_.vocab_size;
  const bool ln = cfg_.norm_type == NormType::LayerNorm;
  ParamSet& p = params_;
  // Column-parallel weights split their rows (output features), row-parallel ones
  // their columns (input features); heads split evenly, FFN and vocabulary padded.
  const int r = tp_.rank;
  auto rows = [&](const std::string& name, int64_t out, int64_t in, ShardRange s, ParamKind k, int g) {
    return p.add_shard(name, {out, in}, 0, s, k, g);
  };
  auto cols = [&](const std::string& name, int64_t out, int64_t in, ShardRange s, ParamKind k, int g) {
    return p.add_shard(name, {out, in}, 1, s, k, g);
  };
  const ShardRange qs{r * QD_, QD_, QD_, QD_}, ks{r * KD_, KD_, KD_, KD_};
  if (spec_.has_embedding)
    embed_ = rows("model.embed_tokens.weight", V, C, vshard_, ParamKind::Embedding, -1);

  int next_stat = 0;
  std::vector<int> globals;  // the stage's layers, chunk after chunk
  chunk_begin_ = {0};
  for (const auto& [first, last] : spec_.chunk_ranges()) {
    for (int g = first; g < last; ++g) globals.push_back(g);
    chunk_begin_.push_back(static_cast<int>(globals.size()));
  }
  for (const int g : globals) {
    Layer l;
    l.global = g;
    l.local = static_cast<int>(layers_.size());
    l.first_param = p.size();
    l.plan = block_plan(cfg_, g);
    // Norms first, in the order the block owns them.
    std::vector<std::pair<NormSlot, std::pair<int, int>>> norms;
    for (NormSlot slot : l.plan.norms()) {
      const std::string base = layer_name(g, norm_slot_name(slot));
      const int gi = p.add(base + ".weight", {C}, ParamKind::NormGain, g);
      const int bi = ln ? p.add(base + ".bias", {C}, ParamKind::NormBias, g) : -1;
      norms.push_back({slot, {gi, bi}});
    }
    auto use = [&](const std::optional<NormSlot>& slot, float scale) {
      NormUse n;
      if (!slot) return n;
      for (auto& [s, gb] : norms)
        if (s == *slot) n.gain = gb.first, n.bias = gb.second;
      n.scale = scale;
      n.stat = next_stat++;
      return n;
    };
    if (l.plan.route) l.router = p.add(layer_name(g, "router.weight"), {2, C}, ParamKind::Router, g);
    const SublayerPlan* plans[2] = {&l.plan.attn, &l.plan.mlp};
    for (int w = 0; w < 2; ++w) {
      // The backward writes b * dr into the output-norm scratch (sublayer_backward).
      LNS_CHECK(!plans[w]->learned_branch_scale || (!plans[w]->add_norm && !plans[w]->out_norm))
          << "a learned branch scale on a plain pre-norm sublayer only";
      if (plans[w]->learned_branch_scale) l.res[w] = p.add(branch_scale_name(g, w), {1}, ParamKind::BranchScale, g);
    }
    const auto set_subs = [&](Layer& into, const SublayerPlan& attn, const SublayerPlan& mlp) {
      const SublayerPlan* ps[2] = {&attn, &mlp};
      for (int w = 0; w < 2; ++w) {
        LNS_CHECK(!ps[w]->learned_branch_scale || ps[w] == plans[w]) << "learned branch scale not on a routed path";
        into.sub[w].plan = *ps[w];
        into.sub[w].pre = use(ps[w]->pre_norm, ps[w]->pre_scale);
        into.sub[w].out = use(ps[w]->out_norm, 1.0f);
        into.sub[w].add = use(ps[w]->add_norm, 1.0f);
      }
    };
    set_subs(l, l.plan.attn, l.plan.mlp);
    if (l.plan.route) {
      l.alt = std::make_unique<Layer>();
      l.alt->is_alt = true;
      set_subs(*l.alt, l.plan.route->attn, l.plan.route->mlp);
    }
    l.wq = rows(layer_name(g, "self_attn.q_proj.weight"), QD, C, qs, ParamKind::Q, g);
    l.wk = rows(layer_name(g, "self_attn.k_proj.weight"), KD, C, ks, ParamKind::K, g);
    l.wv = rows(layer_name(g, "self_attn.v_proj.weight"), KD, C, ks, ParamKind::V, g);
    l.wo = cols(layer_name(g, "self_attn.o_proj.weight"), C, QD, qs, ParamKind::O, g);
    l.wg = rows(layer_name(g, "mlp.gate_proj.weight"), F, C, fshard_, ParamKind::Gate, g);
    l.wu = rows(layer_name(g, "mlp.up_proj.weight"), F, C, fshard_, ParamKind::Up, g);
    l.wd = cols(layer_name(g, "mlp.down_proj.weight"), C, F, fshard_, ParamKind::Down, g);
    if (l.alt) {  // the twin: everything but its sublayers is the layer's
      Layer& t = *l.alt;
      t.global = l.global, t.local = l.local, t.first_param = l.first_param, t.plan = l.plan;
      t.wq = l.wq, t.wk = l.wk, t.wv = l.wv, t.wo = l.wo, t.wg = l.wg, t.wu = l.wu, t.wd = l.wd;
    }
    layers_.push_back(std::move(l));
  }
  if (spec_.has_head) {
    if (!cfg_.folded_norms) {  // folded: model.norm's gain and constant live in lm_head
      final_gain_ = p.add("model.norm.weight", {C}, ParamKind::NormGain, -1);
      if (ln) final_bias_ = p.add("model.norm.bias", {C}, ParamKind::NormBias, -1);
    }
    if (!cfg_.tie_embeddings) {
      head_ = rows("lm_head.weight", V, C, vshard_, ParamKind::LmHead, -1);
    } else if (embed_ >= 0) {
      head_ = embed_;
    } else {  // tied, but the embedding lives on the first stage: keep a copy here
      head_ = rows("model.embed_tokens.weight", V, C, vshard_, ParamKind::Embedding, -1);
      p.mutable_info(head_).tied_copy = true;
    }
  }
}

void LlamaStage::init_weights(uint64_t seed) {
  for (int i = 0; i < params_.size(); ++i) {
    const ParamInfo& info = params_.info(i);
    float* w = params_.host_param(i).f32();
    const int64_t n = info.shape.numel();
    if (info.kind == ParamKind::NormGain || info.kind == ParamKind::NormBias ||
        info.kind == ParamKind::BranchScale) {
      const float v = info.kind == ParamKind::NormBias      ? 0.0f
                      : info.kind == ParamKind::BranchScale ? kBranchScaleInit
                                                            : 1.0f;
      for (int64_t j = 0; j < n; ++j) w[j] = v;
      continue;
    }
    // Each element draws the number its logical index draws on a single rank;
    // tensor-parallel padding is zero.
    // Every element is a pure function of (key, logical index), so the threads split the
    // rows with no effect on the bits (pinned by Init.InitialWeightsArePinnedBitForBit):
    // a 1B model took about 90 s on one thread, minutes at 7B.
    const float std = init_std_for(cfg_, info.kind, info.logical[0], info.logical[1], info.layer);
    const uint64_t key = rng_key(seed, info.name);
    const int64_t cols = info.shape[1], lcols = info.logical[1], rows = n / cols;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        int64_t li, lj, li2, lj2;
        float* out = w + r * cols + c;
        if (!info.to_logical(r, c, &li, &lj)) {
          *out = 0.0f;
          continue;
        }
        const uint64_t at = uint64_t(li * lcols + lj);
        // Both numbers of a Box-Muller pair where the pair's two logical elements are
        // neighbours here (almost always): one draw for two.
        if (at % 2 == 0 && c + 1 < cols && info.to_logical(r, c + 1, &li2, &lj2) &&
            uint64_t(li2 * lcols + lj2) == at + 1) {
          float a, b;
          normal_pair_at(key, at, &a, &b);
          out[0] = std * a, out[1] = std * b;
          ++c;
        } else {
          *out = std * normal_at(key, at);
        }
      }
  }
  params_.upload();
}

}  // namespace lns
