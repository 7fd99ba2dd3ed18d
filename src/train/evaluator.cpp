#include "lns/train/evaluator.h"

#include <algorithm>
#include <cmath>

#include <absl/strings/str_cat.h>

#include "lns/core/errors.h"
#include "lns/core/json_in.h"
#include "lns/core/ops.h"

namespace lns {
namespace {

}  // namespace

Evaluator::Evaluator(ProcessGrid& grid, LlamaStage& stage, PipelineSchedule1F1B& pipeline,
                     const TokenCorpus& data, EvalOptions opt)
    : grid_(grid), stage_(stage), pipeline_(pipeline),
      sampler_(data, opt.mode, opt.seq_len, 0, /*shuffle=*/false, stage.config().vocab_size),
      opt_(opt), in_(DType::I32, {opt.micro_batch, opt.seq_len}),
      tg_(DType::I32, {opt.micro_batch, opt.seq_len}) {
  LNS_REQUIRE(opt.eval_tokens > 0, "--eval_tokens must be positive, got ", opt.eval_tokens);
  // Never more than the data holds: each sample once, none read twice.
  int64_t available = 0;
  if (!mul_within(sampler_.samples_per_epoch(), opt.seq_len, INT64_MAX, &available)) available = INT64_MAX;
  if (opt_.eval_tokens > available) {
    requested_tokens_ = opt_.eval_tokens;
    opt_.eval_tokens = available;
  }
  num_seq_ = (opt_.eval_tokens + opt.seq_len - 1) / opt.seq_len;
  batches_ = (num_seq_ + opt.micro_batch - 1) / opt.micro_batch;
}

int64_t Evaluator::sample_of(int64_t seq) const {
  const int64_t S = sampler_.samples_per_epoch();
  if (!opt_.spread || seq >= num_seq_) return seq % S;
  // floor(seq * S / n) without overflow: n <= S, so the samples are distinct and ascending
  return static_cast<int64_t>(static_cast<unsigned __int128>(seq) * static_cast<uint64_t>(S) /
                              static_cast<uint64_t>(num_seq_));
}

// Micro-batch k goes to dp rank k % dp; every stage of that rank walks the same k.
int64_t Evaluator::my_batches() const {
  return (batches_ - grid_.coords.dp + grid_.layout.dp - 1) / grid_.layout.dp;
}

void Evaluator::fill(int j) {
  const int64_t B = opt_.micro_batch, T = opt_.seq_len;
  const int64_t k = grid_.coords.dp + int64_t{j} * grid_.layout.dp;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t seq = k * B + b;
    int32_t* tgt = tg_.i32() + b * T;
    sampler_.fill(static_cast<uint64_t>(sample_of(seq)), in_.i32() + b * T, tgt);
    // Exactly eval_tokens target positions count: mask the rest of the last batch.
    for (int64_t t = 0; t < T; ++t)
      if (seq * T + t >= opt_.eval_tokens) tgt[t] = kIgnoreIndex;
  }
}

EvalStats Evaluator::reduce(double loss_sum, int64_t tokens) const {
  const bool reports = grid_.reports_loss();
  double totals[2] = {reports ? loss_sum : 0.0, reports ? double(tokens) : 0.0};
  grid_.world().all_reduce(totals, 2, ReduceOp::Sum);
  EvalStats e;
  e.tokens = static_cast<int64_t>(totals[1]);
  e.loss = e.tokens > 0 ? totals[0] / e.tokens : 0.0;
  e.ppl = std::exp(e.loss);
  return e;
}

EvalStats Evaluator::evaluate() {
  const int64_t B = opt_.micro_batch, T = opt_.seq_len;
  int64_t tokens = 0;
  const double sum = pipeline_.forward_only(
      static_cast<int>(my_batches()),
      [&](int j) {
        fill(j);
        return Tensor(in_);
      },
      [&](int j) {
        fill(j);
        tokens += count_unmasked(tg_.i32(), B * T);
        return tg_.t.view({B * T});
      });
  return reduce(sum, tokens);
}

BlendEvaluator::BlendEvaluator(ProcessGrid& grid, LlamaStage& stage, PipelineSchedule1F1B& pipeline,
                               const DataBlend& data, EvalOptions opt)
    : data_(data), opt_(opt) {
  LNS_REQUIRE(opt.eval_tokens > 0, "--eval_tokens must be positive, got ", opt.eval_tokens);
  for (int k = 0; k < data.size(); ++k) {
    EvalOptions part = opt;
    if (data.size() > 1)
      part.eval_tokens = std::max<int64_t>(1, std::llround(data.weight(k) * static_cast<double>(opt.eval_tokens)));
    parts_.push_back(std::make_unique<Evaluator>(grid, stage, pipeline, data.corpus(k), part));
  }
}

EvalStats BlendEvaluator::evaluate() {
  if (!data_.weighted()) return parts_.front()->evaluate();
  EvalStats all;
  double loss_sum = 0;
  for (size_t k = 0; k < parts_.size(); ++k) {
    const EvalStats e = parts_[k]->evaluate();  // collective: every rank walks the same sources
    all.by_source.push_back({data_.name(static_cast<int>(k)), e.loss, e.ppl, e.tokens});
    loss_sum += e.loss * static_cast<double>(e.tokens);
    all.tokens += e.tokens;
  }
  all.loss = all.tokens > 0 ? loss_sum / static_cast<double>(all.tokens) : 0.0;
  all.ppl = std::exp(all.loss);
  return all;
}

std::vector<std::string> BlendEvaluator::shortfalls() const {
  std::vector<std::string> out;
  for (size_t k = 0; k < parts_.size(); ++k) {
    const Evaluator& e = *parts_[k];
    if (e.requested_tokens() == 0) continue;
    const std::string& name = data_.name(static_cast<int>(k));
    out.push_back(data_.size() > 1
                      ? absl::StrCat("--val_data source ", name, ": its share of --eval_tokens=", opt_.eval_tokens, " (",
                                     e.requested_tokens(), ") is more than it holds; each evaluation covers all of it ",
                                     "once (", e.eval_tokens(), " target positions)")
                      : absl::StrCat("--eval_tokens=", opt_.eval_tokens, " is more than ", name, " holds; each ",
                                     "evaluation covers all of it once (", e.eval_tokens(), " target positions)"));
  }
  return out;
}

std::vector<EvalStats> Evaluator::sweep(const std::vector<int>& layers,
                                       const std::function<void(int64_t, int64_t)>& progress) {
  const int64_t B = opt_.micro_batch, T = opt_.seq_len;
  std::vector<EvalStats> out;
  if (grid_.layout.pp > 1) {  // each configuration is a full pipelined evaluation
    const int64_t total = static_cast<int64_t>(layers.size()) + 1;
    out.push_back(evaluate());
    if (progress) progress(1, total);
    for (int k : layers) {
      stage_.set_skipped_layers({k});
      out.push_back(evaluate());
      if (progress) progress(static_cast<int64_t>(out.size()), total);
    }
    stage_.set_skipped_layers({});
    return out;
  }
  // One stage: per batch, the intact pass, then block k skipped for k in decreasing
  // order, each starting from the intact pass's input to block k.
  std::vector<int> order(layers);
  std::sort(order.rbegin(), order.rend());
  std::vector<double> sums(layers.size() + 1, 0.0);
  int64_t tokens = 0;
  for (int64_t j = 0; j < my_batches(); ++j) {
    fill(static_cast<int>(j));
    tokens += count_unmasked(tg_.i32(), B * T);
    const Tensor targets = tg_.t.view({B * T});
    stage_.forward(in_);
    sums[0] += stage_.loss(targets);
    for (int k : order) {
      stage_.forward_skipping(k);
      const size_t idx = std::find(layers.begin(), layers.end(), k) - layers.begin();
      sums[idx + 1] += stage_.loss(targets);
    }
    if (progress) progress(j + 1, my_batches());
  }
  for (double s : sums) out.push_back(reduce(s, tokens));
  return out;
}

std::vector<LayerDiagnostics> Evaluator::diagnostics(int max_batches) {
  const int L = stage_.config().num_layers;
  constexpr int kFields = 8;  // tokens, sum, sum_sq, elements, norm, angle, angle_last, sequences
  std::vector<double> acc(static_cast<size_t>(L) * kFields, 0.0);
  const int64_t count = max_batches > 0 ? std::min<int64_t>(max_batches, my_batches()) : my_batches();
  // Forward-only micro-batches; each stage collects its own blocks after each one.
  for (int64_t j = 0; j < count; ++j) {
    pipeline_.forward_only(
        1, [&](int) { fill(static_cast<int>(j)); return Tensor(in_); },
        [&](int) { fill(static_cast<int>(j)); return tg_.t.view({opt_.micro_batch * opt_.seq_len}); },
        static_cast<int>(j));
    // The residual stream is replicated over tp, or split over it (sequence parallel).
    if (!grid_.layout.counts_split_tokens(grid_.coords.tp)) continue;
    for (const auto& st : stage_.layer_stats()) {
      double* a = &acc[static_cast<size_t>(st.layer) * kFields];
      a[0] += st.tokens, a[1] += st.sum, a[2] += st.sum_sq, a[3] += st.elements;
      a[4] += st.norm, a[5] += st.angle, a[6] += st.angle_last, a[7] += st.sequences;
    }
  }
  grid_.world().all_reduce(acc.data(), static_cast<int>(acc.size()), ReduceOp::Sum);
  std::vector<LayerDiagnostics> out(L);
  for (int l = 0; l < L; ++l) {
    const double* a = &acc[static_cast<size_t>(l) * kFields];
    LayerDiagnostics& d = out[l];
    d.layer = l;
    const double mean = a[1] / std::max(a[3], 1.0);
    d.variance = a[2] / std::max(a[3], 1.0) - mean * mean;
    d.mean_norm = a[4] / std::max(a[0], 1.0);
    d.angular = a[5] / std::max(a[0], 1.0);
    d.angular_last = a[6] / std::max(a[7], 1.0);
  }
  return out;
}

DivisorSums Evaluator::divisor_sums() {
  const int L = stage_.config().num_layers;
  DivisorSums local(2 * size_t(L) + 1, {0.0, 0.0, 0.0, 0.0});
  for (int64_t j = 0; j < my_batches(); ++j) {
    pipeline_.forward_only(
        1, [&](int) { fill(static_cast<int>(j)); return Tensor(in_); },
        [&](int) { fill(static_cast<int>(j)); return tg_.t.view({opt_.micro_batch * opt_.seq_len}); },
        static_cast<int>(j));
    stage_.add_divisor_sums(local);  // every chunk of the stage, in micro-batch order: deterministic
  }
  // Each stage fills its own layers' entries (the others stay 0); summed over the dp
  // ranks, and over the tp ranks where each holds its own tokens (sequence parallel).
  std::vector<double> all(local.size() * 4, 0.0);
  if (grid_.layout.counts_split_tokens(grid_.coords.tp))
    for (size_t g = 0; g < local.size(); ++g)
      for (int k = 0; k < 4; ++k) all[g * 4 + k] = local[g][k];
  grid_.world().all_reduce(all.data(), static_cast<int>(all.size()), ReduceOp::Sum);
  DivisorSums out(local.size());
  for (size_t g = 0; g < out.size(); ++g)
    for (int k = 0; k < 4; ++k) out[g][k] = all[g * 4 + k];
  return out;
}

std::vector<double> block_grad_norms(ProcessGrid& grid, const ParamSet& params,
                                     const GradientSync& sync, int num_layers) {
  std::vector<double> sq(num_layers, 0.0);
  const Tensor g = params.flat_grads();
  for (const ParamInfo& p : params.infos()) {
    if (p.layer < 0 || !p.counted_on(grid.coords.tp)) continue;  // blocks only
    const int64_t lo = std::max<int64_t>(sync.shard_begin(), p.offset),
                  hi = std::min<int64_t>(sync.shard_end(), p.offset + p.shape.numel());
    if (lo >= hi) continue;
    sq[p.layer] += sum_squares(g.rows(lo, hi));
  }
  grid.world().all_reduce(sq.data(), num_layers, ReduceOp::Sum);
  for (double& v : sq) v = std::sqrt(v);
  return sq;
}

}  // namespace lns
