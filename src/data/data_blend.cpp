// Weighted blends of corpora (--data=0.7:A,0.3:B): the text, the interleaving index,
// the opened sources and the blended stream (lns/data/data.h, docs/data.md).
#include <algorithm>
#include <cmath>
#include <numeric>

#include <absl/strings/numbers.h>
#include <absl/strings/str_split.h>

#include "lns/data/data.h"
#include "lns/core/errors.h"

namespace lns {
namespace {

// An item starts a source when it reads WEIGHT:...: a ':' with no '/' before it, so a
// path such as data/a:b.tok stays a path (and ./name:x.tok escapes a bare name).
bool has_weight(absl::string_view item) {
  const size_t colon = item.find(':');
  return colon != absl::string_view::npos && item.substr(0, colon).find('/') == absl::string_view::npos;
}

}  // namespace

BlendSpec parse_blend_spec(const std::string& spec, const std::string& flag) {
  const std::vector<std::string> items = absl::StrSplit(spec, ',', absl::SkipEmpty());
  BlendSpec out;
  out.weighted = std::any_of(items.begin(), items.end(), [](const std::string& i) { return has_weight(i); });
  if (!out.weighted) {  // today's meaning, untouched: the whole text is one corpus
    out.sources.push_back({spec, 1.0});
    return out;
  }
  for (const std::string& item : items) {
    if (!has_weight(item)) {
      if (out.sources.empty())
        fail(flag, ": '", item, "' has no weight but a later source does; in a blend every source starts with ",
             "WEIGHT:PATH (write a path with ':' in its first part as ./PATH)");
      out.sources.back().path += "," + item;  // one more shard of the source before it
      continue;
    }
    const size_t colon = item.find(':');
    const std::string text = item.substr(0, colon), path = item.substr(colon + 1);
    const size_t n = out.sources.size() + 1;
    double w = 0;
    if (!absl::SimpleAtod(text, &w))
      fail(flag, ": the weight '", text, "' of source ", n, " is not a number (expected WEIGHT:PATH,... e.g. ",
           flag, "=0.7:a.tok,0.3:b.tok)");
    if (!std::isfinite(w)) fail(flag, ": the weight '", text, "' of source ", n, " is not a finite number");
    if (w < 0) fail(flag, ": the weight ", text, " of source ", n, " (", path, ") is negative; weights must be positive");
    if (w == 0)
      fail(flag, ": the weight ", text, " of source ", n, " (", path, ") is zero; weights must be positive ",
           "(leave the source out instead)");
    if (path.empty()) fail(flag, ": source ", n, " has the weight ", text, " but no path");
    out.sources.push_back({path, w});
  }
  if (out.sources.size() > static_cast<size_t>(BlendIndex::kMaxSources))
    fail(flag, ": ", out.sources.size(), " sources in the blend, at most ", BlendIndex::kMaxSources);
  for (size_t a = 0; a < out.sources.size(); ++a)
    for (size_t b = 0; b < a; ++b)
      if (out.sources[a].path == out.sources[b].path)
        fail(flag, ": '", out.sources[a].path, "' is given twice (sources ", b + 1, " and ", a + 1,
             "); give each source once with its total weight");
  return out;
}

BlendIndex::BlendIndex(const std::vector<double>& weights, const std::vector<std::string>& names,
                       const std::string& flag) {
  const int K = static_cast<int>(weights.size());
  LNS_CHECK(K >= 1 && K <= kMaxSources && names.size() == weights.size());
  per_period_.assign(K, 0);
  if (K == 1) {  // the identity: position i is the source's sample i
    per_period_[0] = kPeriod;
    return;
  }
  // Weights as integers (2^24 for the largest), so the greedy below is exact and the
  // same on every machine and compiler: err_k(j) = q_k * (j + 1) - picks_k * Q is the
  // weight error w_k * (j + 1) - picks_k scaled by Q = sum q (at most 2^52 here).
  const double top = *std::max_element(weights.begin(), weights.end());
  std::vector<int64_t> q(K);
  int64_t Q = 0;
  for (int k = 0; k < K; ++k) Q += q[k] = std::llround(weights[k] / top * double(int64_t{1} << 24));
  source_.resize(kPeriod);
  rank_.resize(kPeriod);
  where_.assign(K, {});
  for (int64_t j = 0; j < kPeriod; ++j) {
    int best = 0;
    int64_t best_err = INT64_MIN;
    for (int k = 0; k < K; ++k) {
      const int64_t err = q[k] * (j + 1) - per_period_[k] * Q;
      if (err > best_err) best = k, best_err = err;
    }
    source_[j] = static_cast<uint16_t>(best);
    rank_[j] = static_cast<uint32_t>(per_period_[best]++);
    where_[best].push_back(static_cast<uint32_t>(j));
  }
  for (int k = 0; k < K; ++k)
    if (per_period_[k] == 0)
      fail(flag, ": the weight of source ", k + 1, " (", names[k], ") is too small beside the others: its share ",
           weights[k] / std::accumulate(weights.begin(), weights.end(), 0.0), " draws no sample in ", kPeriod);
}

BlendIndex::Pick BlendIndex::at(uint64_t position) const {
  if (source_.empty()) return {0, position};
  const uint64_t period = position / kPeriod, j = position % kPeriod;
  const int k = source_[j];
  return {k, period * static_cast<uint64_t>(per_period_[k]) + rank_[j]};
}

uint64_t BlendIndex::count_before(int source, uint64_t position) const {
  if (source_.empty()) return position;
  const uint64_t period = position / kPeriod, j = position % kPeriod;
  const std::vector<uint32_t>& w = where_[source];
  const uint64_t within = std::lower_bound(w.begin(), w.end(), static_cast<uint32_t>(j)) - w.begin();
  return period * static_cast<uint64_t>(per_period_[source]) + within;
}

DataBlend::DataBlend(std::unique_ptr<TokenCorpus> corpus) {
  names_.push_back(corpus->path());
  weights_.push_back(1.0);
  corpora_.push_back(std::move(corpus));
  index_ = std::make_unique<BlendIndex>(weights_, names_, "--data");
}

std::unique_ptr<DataBlend> DataBlend::open(const std::string& spec, const std::string& flag) {
  const BlendSpec parsed = parse_blend_spec(spec, flag);
  std::unique_ptr<DataBlend> b(new DataBlend());
  b->weighted_ = parsed.weighted;
  double total = 0;
  // Normalised by the largest first: no sum of huge weights overflows.
  double top = 0;
  for (const BlendSource& s : parsed.sources) top = std::max(top, s.weight);
  for (const BlendSource& s : parsed.sources) total += s.weight / top;
  for (size_t k = 0; k < parsed.sources.size(); ++k) {
    const BlendSource& s = parsed.sources[k];
    b->names_.push_back(s.path);
    b->weights_.push_back(s.weight / top / total);
  }
  // The index first: a weight too small fails before any file is mapped.
  b->index_ = std::make_unique<BlendIndex>(b->weights_, b->names_, flag);
  for (size_t k = 0; k < parsed.sources.size(); ++k) {
    if (!parsed.weighted) {  // exactly today's errors
      b->corpora_.push_back(TokenCorpus::open(parsed.sources[k].path));
      continue;
    }
    try {
      b->corpora_.push_back(TokenCorpus::open(parsed.sources[k].path));
    } catch (const UserError& e) {
      fail(flag, " source ", k + 1, " of ", parsed.sources.size(), ": ", e.what());
    }
  }
  return b;
}

void fill_dp_share(uint64_t first, int64_t global_batch, int dp_rank, int dp_size, Tensor inputs,
                   Tensor targets, const std::function<void(uint64_t, int32_t*, int32_t*)>& fill) {
  LNS_CHECK(global_batch > 0 && global_batch % dp_size == 0);
  const int64_t n = global_batch / dp_size, T = inputs.numel() / n;
  LNS_CHECK(inputs.numel() == n * T && targets.numel() == n * T);
  for (int64_t i = 0; i < n; ++i)
    fill(first + uint64_t(dp_rank) * n + i, inputs.i32() + i * T, targets.i32() + i * T);
}

BlendedSampler::BlendedSampler(const DataBlend& data, SampleMode mode, int64_t seq_len, uint64_t seed,
                               bool shuffle, int64_t vocab_size)
    : data_(data) {
  // Source k's own order from seed + k * 2^32: epochs (seed + epoch) of different
  // sources never share a permutation, and source 0 is the unblended sampler.
  for (int k = 0; k < data.size(); ++k)
    samplers_.push_back(std::make_unique<BatchSampler>(data.corpus(k), mode, seq_len,
                                                       seed + (static_cast<uint64_t>(k) << 32), shuffle, vocab_size));
}

int64_t BlendedSampler::fill(uint64_t index, int32_t* inputs, int32_t* targets) {
  const BlendIndex::Pick p = data_.index().at(index);
  return samplers_[p.source]->fill(p.index, inputs, targets);
}

void BlendedSampler::next_batch(int64_t global_batch, int dp_rank, int dp_size, Tensor inputs, Tensor targets) {
  fill_dp_share(consumed_, global_batch, dp_rank, dp_size, inputs, targets,
                [&](uint64_t i, int32_t* in, int32_t* tg) { fill(i, in, tg); });
  consumed_ += global_batch;
}

int64_t BlendedSampler::sample_of(uint64_t index) {
  const BlendIndex::Pick p = data_.index().at(index);
  return samplers_[p.source]->sample_of(p.index);
}

std::vector<uint64_t> BlendedSampler::samples_by_source() const {
  std::vector<uint64_t> out(data_.size());
  for (int k = 0; k < data_.size(); ++k) out[k] = data_.index().count_before(k, consumed_);
  return out;
}

}  // namespace lns
