#include "lns/model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "lns/core/errors.h"
#include "lns/core/rng.h"
#include "lns/model/stage.h"

namespace lns {

void check_sampling(const SamplingConfig& c) {
  LNS_REQUIRE(std::isfinite(c.temperature) && c.temperature >= 0.0f,
              "--temperature must be >= 0 (0: greedy), got ", c.temperature);
  LNS_REQUIRE(c.top_k >= 0, "--top_k must be >= 0 (0: no limit), got ", c.top_k);
  LNS_REQUIRE(std::isfinite(c.top_p) && c.top_p > 0.0f && c.top_p <= 1.0f, "--top_p must be in (0, 1], got ",
              c.top_p);
}

std::vector<double> sampling_distribution(const std::vector<float>& logits, const SamplingConfig& c) {
  const int64_t V = static_cast<int64_t>(logits.size());
  LNS_CHECK(V > 0);
  for (const float z : logits) LNS_REQUIRE(std::isfinite(z), "the model's logits are not finite (inf or NaN)");
  // Token ids from most to least likely, the lower id first among equals.
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  std::vector<double> p(V, 0.0);
  if (c.temperature == 0.0f) {
    p[order[0]] = 1.0;
    return p;
  }
  const int64_t k = c.top_k > 0 ? std::min<int64_t>(c.top_k, V) : V;
  // softmax over the k most likely, in f64
  const double zmax = logits[order[0]];
  double sum = 0.0;
  for (int64_t r = 0; r < k; ++r) sum += p[order[r]] = std::exp((logits[order[r]] - zmax) / c.temperature);
  for (int64_t r = 0; r < k; ++r) p[order[r]] /= sum;
  if (c.top_p < 1.0f) {
    // Keep token r while the mass of those before it is short of top_p.
    double before = 0.0, kept = 0.0;
    int64_t r = 0;
    for (; r < k && before < c.top_p; ++r) before += p[order[r]];
    for (int64_t s = r; s < k; ++s) p[order[s]] = 0.0;
    for (int64_t s = 0; s < r; ++s) kept += p[order[s]];
    for (int64_t s = 0; s < r; ++s) p[order[s]] /= kept;
  }
  return p;
}

int32_t sample_token(const std::vector<float>& logits, const SamplingConfig& c, float u) {
  const std::vector<double> p = sampling_distribution(logits, c);
  double cum = 0.0;
  int32_t last = -1;
  for (size_t t = 0; t < p.size(); ++t) {
    if (p[t] <= 0.0) continue;
    last = static_cast<int32_t>(t);
    cum += p[t];
    if (u < cum) return last;
  }
  return last;  // u beyond the sum's last rounding: the last token with mass
}

std::vector<int32_t> generate(LlamaStage& stage, const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                              const std::function<void(int32_t)>& on_token) {
  LNS_REQUIRE(!prompt.empty(), "generation needs a prompt of at least one token");
  LNS_REQUIRE(opt.max_new_tokens >= 0, "--max_new_tokens must be >= 0, got ", opt.max_new_tokens);
  check_sampling(opt.sampling);
  std::vector<int32_t> out;
  if (opt.max_new_tokens == 0) return out;
  const int64_t P = static_cast<int64_t>(prompt.size());
  stage.start_decode(P + opt.max_new_tokens);
  const uint64_t key = rng_key(opt.sampling.seed, "generate");
  std::vector<float> logits = stage.decode(prompt, 0);
  for (int64_t i = 0; i < opt.max_new_tokens; ++i) {
    const int32_t t = sample_token(logits, opt.sampling, uniform_at(key, static_cast<uint64_t>(i)));
    out.push_back(t);
    if (on_token) on_token(t);
    if (std::find(opt.stop_ids.begin(), opt.stop_ids.end(), t) != opt.stop_ids.end()) break;
    if (i + 1 < opt.max_new_tokens) logits = stage.decode({t}, P + i);
  }
  return out;
}

}  // namespace lns
