#include "lns/model/activation_memory.h"

#include <absl/strings/str_format.h>

#include "lns/model/block_plan.h"
#include "lns/core/device.h"
#include "lns/core/errors.h"
#include "parallel/shard.h"

namespace lns {
namespace {

// "12.34 MiB (12939444 B)": readable, and exact for tools that compare it.
std::string mib(int64_t bytes) { return absl::StrFormat("%.2f MiB (%d B)", bytes / 1048576.0, bytes); }

}  // namespace

int64_t ActivationAccount::per_micro_batch() const {
  int64_t b = stage_bytes;
  for (const Layer& l : layers) b += l.kept_bytes;
  return b;
}

int64_t ActivationAccount::total() const {
  int64_t b = workspace_bytes + gradient_bytes;
  for (size_t c = 0; c < chunk_slots.size(); ++c) b += chunk_slots[c] * chunk_bytes[c];
  return b;
}

std::string ActivationAccount::str() const {
  std::string s = "activation memory per micro-batch:";
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1].mode == layers[i].mode &&
           layers[j + 1].kept_bytes == layers[i].kept_bytes)
      ++j;
    s += absl::StrFormat(" layers %d-%d %s %s each;", layers[i].global, layers[j].global,
                         recompute_mode_name(layers[i].mode), mib(layers[i].kept_bytes));
    i = j + 1;
  }
  std::string flight = absl::StrFormat("%d", num_slots);
  if (chunk_slots.size() > 1) {  // --virtual_stages: each chunk's slots hold its own layers
    flight = "(per chunk";
    for (size_t c = 0; c < chunk_slots.size(); ++c)
      flight += absl::StrFormat(" %s x %d", mib(chunk_bytes[c]), chunk_slots[c]);
    flight += ")";
  }
  s += absl::StrFormat(" embedding/head %s; total %s x %s in flight + recompute workspace %s + "
                       "gradient buffers %s = %s",
                       mib(stage_bytes), mib(per_micro_batch()), flight, mib(workspace_bytes),
                       mib(gradient_bytes), mib(total()));
  return s;
}

ActivationAccount activation_account(const LlamaConfig& cfg, StageSpec spec, int64_t B, int64_t T,
                                     int num_slots, TensorParallel tp, Device device) {
  return activation_account(cfg, spec, B, T, std::vector<int>(spec.num_chunks(), num_slots), tp, device);
}

ActivationAccount activation_account(const LlamaConfig& cfg, StageSpec spec, int64_t B, int64_t T,
                                     const std::vector<int>& chunk_slots, TensorParallel tp, Device device) {
  cfg.validate();
  LNS_CHECK(static_cast<int>(chunk_slots.size()) == spec.num_chunks());
  const int64_t a = static_cast<int64_t>(dtype_size(activation_dtype(device)));
  const int64_t N = B * T, C = cfg.hidden_size, D = cfg.head_dim();
  const int64_t Hq = cfg.num_heads / tp.size, QD = Hq * D, KD = cfg.num_kv_heads / tp.size * D;
  // FFN and vocabulary shards as the device stores them (padded to the GEMM alignment)
  const int64_t align = gemm_dim_align(device);
  const int64_t F = shard_range(cfg.intermediate_size, tp.size, tp.rank, align).stored;
  const int64_t V = shard_range(cfg.vocab_size, tp.size, tp.rank, align).stored;
  // The split regions (norm inputs and outputs, residual stream, norm statistics, the
  // hidden states between stages) hold the rank's NL tokens: N / tp under
  // --sequence_parallel (the layout's sequence_shard, asked through tp.token_shard, the
  // same call that sizes LlamaStage::hidden_tokens()), N otherwise. The tensor-parallel
  // interiors (q/k/v, attention, FFN), the logits and the token ids hold all N.
  const int64_t NL = tp.token_shard(N).size;
  const int64_t NC = NL * C * a;  // one split-region [NL, C] buffer
  const int64_t stat = NL * 4 * (cfg.norm_type == NormType::LayerNorm ? 2 : 1);  // rstd (+ mean)
  const int64_t core = N * QD * a + attention_saved_shape(device, B, T, Hq).numel() * 4 + N * F * a;
  const int64_t qkv_gate_up = N * (QD + 2 * KD) * a + 2 * N * F * a;

  ActivationAccount acc;
  acc.num_slots = chunk_slots.at(0);
  acc.chunk_slots = chunk_slots;
  acc.chunk_bytes.assign(chunk_slots.size(), 0);
  bool any_selective = false, any_full = false, any_routed = false;
  // The workspace of full layers: each buffer once, where any full path has it.
  bool u[2] = {}, f2[2] = {}, add[2] = {};
  bool stats[6] = {};
  // What one path (a layer's two sublayers) keeps in `mode`.
  auto path = [&](const SublayerPlan& attn, const SublayerPlan& mlp, RecomputeMode mode) {
    const SublayerPlan* sub[2] = {&attn, &mlp};
    if (mode == RecomputeMode::Full) {
      any_full = true;
      for (int s = 0; s < 2; ++s) {
        const bool has[3] = {bool(sub[s]->pre_norm), bool(sub[s]->out_norm), bool(sub[s]->add_norm)};
        u[s] |= has[0], f2[s] |= has[1], add[s] |= has[2];
        for (int k = 0; k < 3; ++k) stats[3 * s + k] |= has[k];
      }
      return NC;  // the path's output
    }
    int64_t kept = qkv_gate_up + (mode == RecomputeMode::None ? core : 0);
    for (int s = 0; s < 2; ++s) {
      const int norms = bool(sub[s]->pre_norm) + bool(sub[s]->out_norm) + bool(sub[s]->add_norm);
      kept += (2 + norms) * NC + norms * stat;  // f, r, and u / f2 / y
    }
    any_selective |= mode == RecomputeMode::Selective;
    return kept;
  };
  const auto ranges = spec.chunk_ranges();
  int local = 0;  // the stage's layer index, across chunks (--recompute_layers counts it)
  for (size_t c = 0; c < ranges.size(); ++c)
    for (int g = ranges[c].first; g < ranges[c].second; ++g, ++local) {
      const BlockPlan p = block_plan(cfg, g);
      ActivationAccount::Layer l{g, layer_recompute(cfg.recompute, cfg.recompute_layers, local), 0};
      l.kept_bytes = path(p.attn, p.mlp, l.mode);
      if (p.route) {  // path 1, the gate's five [B,2] f32 and the mixed output [N,C]
        // (routed blocks never run with --sequence_parallel: NL = N here)
        l.kept_bytes += path(p.route->attn, p.route->mlp, l.mode) + 5 * B * 2 * 4 + N * C * a;
        any_routed = true;
      }
      acc.layers.push_back(l);
      acc.chunk_bytes[c] += l.kept_bytes;
    }
  if (any_selective || any_full) acc.workspace_bytes += core;
  if (any_full) {
    acc.workspace_bytes += qkv_gate_up;
    for (int s = 0; s < 2; ++s) {
      acc.workspace_bytes += NC * (1 + u[s] + f2[s]);  // f, u, f2
      // r of the attention sublayer; the MLP's r only before an N_add (else the output);
      // y of the attention sublayer where it has an N_add (the MLP's is the output)
      acc.workspace_bytes += NC * ((s == 0 || add[s]) + (s == 0 && add[s]));
    }
    for (bool st : stats) acc.workspace_bytes += st ? stat : 0;
  }
  // Every slot: ids [B,T] (every stage: LN-free's end-of-text rows) and h0 [NL,C]; the
  // last chunk's slots on the last stage: final norm statistics and output hf [NL,C],
  // logits [N,V], the loss's six [N] f32 (targets, losses, row max, this rank's max,
  // sum-exp, target logit).
  for (size_t c = 0; c < ranges.size(); ++c) {
    int64_t b = N * 4 + NC;
    if (spec.has_head && c + 1 == ranges.size()) b += stat + NC + N * V * a + N * 4 * 6;
    acc.chunk_bytes[c] += b, acc.stage_bytes += b;
  }
  // Backward: six split-region [NL,C] gradients, and under --sequence_parallel two
  // full-token [N,C] buffers of the tensor-parallel region (a gathered input, a partial
  // result before its reduce-scatter); dq dctx [N,QD], dk dv [N,KD], dgate dup dact [N,F];
  // routed blocks each path's [N,C] output gradient.
  acc.gradient_bytes = 6 * NC + (tp.sequence_parallel ? 2 * N * C * a : 0) + 2 * N * (QD + KD) * a +
                       3 * N * F * a + (any_routed ? 2 * N * C * a : 0);
  return acc;
}

}  // namespace lns
