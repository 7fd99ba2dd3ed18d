// Generation (lns/model/generate.h, LlamaStage::decode): the key/value-cache path against
// forward() on the whole sequence (the logits of every position) for the schemes of the
// block plan, and the next-token distribution (greedy, temperature, top-k, top-p)
// against a plain reference that ranks each token on its own.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "lns/core/errors.h"
#include "lns/model/generate.h"
#include "lns/model/stage.h"
#include "tests/common/generate_cases.h"
#include "tests/common/test_util.h"

namespace lns {
namespace {

class Decode : public ::testing::TestWithParam<DecodeCase> {};

// A prompt of 7 tokens (decoded in chunks of 3: 3 + 3 + 1) then 9 tokens one at a
// time: every position's logits equal forward() on the whole 16-token sequence.
TEST_P(Decode, CacheEqualsTheWholeSequence) {
  const DecodeCase& c = GetParam();
  const LlamaConfig cfg = decode_config(c);
  const int64_t L = 16, P = 7, V = cfg.vocab_size;
  std::vector<int32_t> ids(L);
  for (int64_t t = 0; t < L; ++t) ids[t] = static_cast<int32_t>((t * 17 + 3) % V);
  ids[0] = 7, ids[9] = 7;  // the end-of-text id of the LN-free case, at 0 and later
  LlamaStage whole(cfg, StageSpec::whole(cfg), 1, L);
  init_decode_weights(whole, c);
  if (whole.needs_token_ids()) whole.set_token_ids(test::view(ids, {1, L}));
  const Tensor logits = whole.forward(test::view(ids, {1, L}));  // [1, L, V]
  const std::vector<float> want(logits.f32(), logits.f32() + L * V);

  LlamaStage dec(cfg, StageSpec::whole(cfg), 1, 1);
  init_decode_weights(dec, c);
  dec.start_decode(L, 3);
  std::vector<float> got, rows;
  const std::vector<float> last = dec.decode({ids.begin(), ids.begin() + P}, 0, &rows);
  got = rows;
  EXPECT_EQ(last, std::vector<float>(rows.end() - V, rows.end()));
  for (int64_t t = P; t < L; ++t) {
    const std::vector<float> r = dec.decode({ids[t]}, t);
    got.insert(got.end(), r.begin(), r.end());
  }
  ASSERT_EQ(got.size(), want.size());
  double scale = 0;
  for (const float w : want) scale = std::max(scale, std::abs(double(w)));
  EXPECT_GT(scale, 0.5) << "logits too small for the comparison to mean much";
  // f32 rounding only (the GEMMs' orders differ): at most 1.7e-6 measured (deeppost, 2026-11-29),
  // 1.6e-7 for most schemes; the keys rotated at position 0 instead of theirs gave 0.03-0.07.
  for (int64_t t = 0; t < L; ++t) {
    const double e = test::rel_max_err(got.data() + t * V, want.data() + t * V, V, scale);
    EXPECT_LE(e, 1e-5) << c.name << ": position " << t << " (relative to the largest logit " << scale << ")";
  }
  // A new sequence in the same cache forgets the first one.
  dec.start_decode(L, 3);
  const std::vector<float> again = dec.decode({ids.begin(), ids.begin() + P}, 0);
  EXPECT_EQ(again, last) << "not bit-equal to the first pass: " << test::rel_max_err(again.data(), last.data(), V);
}

INSTANTIATE_TEST_SUITE_P(
    Schemes, Decode,
    ::testing::Values(DecodeCase{"pre", NormScheme::Pre}, DecodeCase{"lns", NormScheme::LNS},
                      DecodeCase{"lns_layernorm_tied", NormScheme::LNS, NormType::LayerNorm, true},
                      DecodeCase{"post", NormScheme::Post}, DecodeCase{"mix", NormScheme::Mix, NormType::LayerNorm},
                      DecodeCase{"sandwich", NormScheme::Sandwich}, DecodeCase{"deepnorm", NormScheme::DeepNorm},
                      DecodeCase{"scaled_init", NormScheme::ScaledInit}, DecodeCase{"deeppost", NormScheme::DeepPost},
                      DecodeCase{"scale_post_pre", NormScheme::ScalePostPre},
                      DecodeCase{"scale_res_pre_norm", NormScheme::ScaleResPre},
                      DecodeCase{"hybrid", NormScheme::Hybrid, NormType::LayerNorm, false, "sandwich,post,pre"},
                      DecodeCase{"ln_free_lns", NormScheme::LNS, NormType::RMSNorm, false, "", true},
                      DecodeCase{"ln_free_layernorm", NormScheme::Pre, NormType::LayerNorm, false, "", true},
                      DecodeCase{"folded", NormScheme::Pre, NormType::RMSNorm, false, "", false, true}),
    [](const auto& info) { return info.param.name; });

TEST(Decode, RoutedBlocksAreRefused) {
  DecodeCase c{"mono", NormScheme::Mono};
  LlamaConfig cfg = decode_config(c);
  cfg.num_layers = 4;  // layer 3 routed
  LlamaStage st(cfg, StageSpec::whole(cfg), 1, 1);
  try {
    st.start_decode(8);
    FAIL() << "start_decode accepted a routed block";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 3 is a routed block"), std::string::npos) << e.what();
  }
}

TEST(Decode, BadTokensAndPositionsAreUserErrors) {
  const LlamaConfig cfg = decode_config({"pre", NormScheme::Pre});
  LlamaStage st(cfg, StageSpec::whole(cfg), 1, 1);
  st.init_weights(1);
  st.start_decode(4);
  EXPECT_THROW(st.decode({50}, 0), UserError);        // vocabulary is [0, 50)
  EXPECT_THROW(st.decode({1, 2, 3}, 2), UserError);   // positions 2..4 of 4
  EXPECT_THROW(st.decode({}, 0), UserError);
}

// ---- the next-token distribution -------------------------------------------------------

// The plain reference: softmax(z / T) in f64; token t survives top-k when fewer than k
// tokens rank before it, top-p when the (top-k renormalised) mass of those ranking
// before it is short of p. "Ranks before": more likely, or as likely with a lower id.
std::vector<double> reference_distribution(const std::vector<float>& z, float T, int k, float p) {
  const int64_t V = static_cast<int64_t>(z.size());
  auto before = [&](int64_t a, int64_t t) { return z[a] > z[t] || (z[a] == z[t] && a < t); };
  std::vector<double> e(V), q(V, 0.0);
  double zmax = *std::max_element(z.begin(), z.end()), sum = 0;
  std::vector<bool> keep(V);
  for (int64_t t = 0; t < V; ++t) {
    int64_t rank = 0;
    for (int64_t a = 0; a < V; ++a) rank += before(a, t);
    keep[t] = k == 0 || rank < k;
    e[t] = std::exp((double(z[t]) - zmax) / T);
    if (keep[t]) sum += e[t];
  }
  std::vector<bool> keep_p(V);
  for (int64_t t = 0; t < V; ++t) {
    double mass = 0;
    for (int64_t a = 0; a < V; ++a)
      if (keep[a] && before(a, t)) mass += e[a] / sum;
    keep_p[t] = keep[t] && (p >= 1.0f || mass < p);
  }
  double total = 0;
  for (int64_t t = 0; t < V; ++t) total += keep_p[t] ? e[t] : 0.0;
  for (int64_t t = 0; t < V; ++t) q[t] = keep_p[t] ? e[t] / total : 0.0;
  return q;
}

TEST(Sampling, TopKTopPTemperatureEqualThePlainReference) {
  int cases = 0;
  for (int seed = 0; seed < 6; ++seed) {
    std::vector<float> z = test::randn(40, 500 + seed, 2.0f);
    if (seed % 2 == 1) {  // ties, in the kept set and at the top-k / top-p edges
      for (int i = 0; i < 40; i += 3) z[i] = z[0];
      z[5] = z[6] = z[7];
    }
    for (const float T : {0.5f, 1.0f, 1.7f})
      for (const int k : {0, 1, 3, 10, 40, 100})
        for (const float p : {1.0f, 0.95f, 0.5f, 0.1f, 1e-6f}) {
          const SamplingConfig c{T, k, p, 0};
          const std::vector<double> got = sampling_distribution(z, c), want = reference_distribution(z, T, k, p);
          ASSERT_EQ(got.size(), want.size());
          for (size_t t = 0; t < got.size(); ++t) {
            ASSERT_EQ(got[t] > 0, want[t] > 0) << "token " << t << " masked differently: T=" << T << " k=" << k
                                               << " p=" << p << " seed " << seed;
            ASSERT_NEAR(got[t], want[t], 1e-12) << "token " << t << " T=" << T << " k=" << k << " p=" << p;
          }
          ++cases;
        }
  }
  EXPECT_EQ(cases, 6 * 3 * 6 * 5);
}

TEST(Sampling, GreedyIsTheLowestIdAmongTheMostLikely) {
  const std::vector<float> z = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  const SamplingConfig greedy{0.0f, 0, 1.0f, 0};
  EXPECT_EQ(sampling_distribution(z, greedy), (std::vector<double>{0, 1, 0, 0, 0}));
  for (const float u : {1e-7f, 0.5f, 0.9999999f}) EXPECT_EQ(sample_token(z, greedy, u), 1);
}

// Draws through the inverse CDF in id order: u in [cum(t-1), cum(t)) gives t; and over
// 20000 seeded draws each token's share is within 4 standard errors of its probability.
TEST(Sampling, DrawsFollowTheDistribution) {
  const std::vector<float> z = {1.0f, 0.0f, 2.0f, -3.0f, 1.5f};
  const SamplingConfig c{1.0f, 4, 0.9f, 0};
  const std::vector<double> p = sampling_distribution(z, c);
  double cum = 0;
  for (int t = 0; t < 5; ++t) {
    if (p[t] == 0) continue;
    EXPECT_EQ(sample_token(z, c, static_cast<float>(cum + 0.5 * p[t])), t);
    cum += p[t];
  }
  const int n = 20000;
  std::vector<int> count(5, 0);
  const uint64_t key = rng_key(42, "generate");
  for (int i = 0; i < n; ++i) ++count[sample_token(z, c, uniform_at(key, i))];
  for (int t = 0; t < 5; ++t) {
    const double se = std::sqrt(p[t] * (1 - p[t]) / n);
    EXPECT_NEAR(double(count[t]) / n, p[t], 4 * se + 1e-12) << "token " << t << ": " << count[t] << " of " << n;
  }
  EXPECT_EQ(count[3], 0) << "token 3 is outside the top-4";
}

TEST(Sampling, BadSettingsNameTheirFlag) {
  auto message = [](SamplingConfig c) {
    try {
      check_sampling(c);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message({-0.5f, 0, 1.0f, 0}).find("--temperature"), std::string::npos);
  EXPECT_NE(message({1.0f, -2, 1.0f, 0}).find("--top_k"), std::string::npos);
  EXPECT_NE(message({1.0f, 0, 0.0f, 0}).find("--top_p"), std::string::npos);
  EXPECT_NE(message({1.0f, 0, 1.5f, 0}).find("--top_p"), std::string::npos);
  EXPECT_NE(message({NAN, 0, 1.0f, 0}).find("--temperature"), std::string::npos);
  EXPECT_EQ(message({0.0f, 0, 1.0f, 0}), "(accepted)");
}

// generate(): the same seed draws the same tokens, another seed others; greedy equals
// the argmax of forward() on the growing sequence (no cache), token by token.
TEST(Generate, GreedyEqualsArgmaxOfTheWholeSequence) {
  const DecodeCase c{"lns", NormScheme::LNS};
  const LlamaConfig cfg = decode_config(c);
  LlamaStage st(cfg, StageSpec::whole(cfg), 1, 1);
  init_decode_weights(st, c);
  const std::vector<int32_t> prompt = {3, 14, 15, 9};
  GenerateOptions opt;
  opt.max_new_tokens = 10;
  opt.sampling.temperature = 0;
  const std::vector<int32_t> got = generate(st, prompt, opt);
  ASSERT_EQ(got.size(), 10u);
  std::vector<int32_t> seq = prompt;
  for (size_t i = 0; i < got.size(); ++i) {
    const int64_t L = static_cast<int64_t>(seq.size());
    LlamaStage whole(cfg, StageSpec::whole(cfg), 1, L);
    init_decode_weights(whole, c);
    const Tensor logits = whole.forward(test::view(seq, {1, L}));
    const float* row = logits.f32() + (L - 1) * cfg.vocab_size;
    const int32_t want = static_cast<int32_t>(std::max_element(row, row + cfg.vocab_size) - row);
    ASSERT_EQ(got[i], want) << "new token " << i;
    seq.push_back(want);
  }
  opt.sampling = {1.0f, 0, 1.0f, 5};
  const std::vector<int32_t> a = generate(st, prompt, opt), b = generate(st, prompt, opt);
  EXPECT_EQ(a, b);
  opt.sampling.seed = 6;
  EXPECT_NE(generate(st, prompt, opt), a) << "another seed drew the same 10 tokens";
  opt.stop_ids = {a[2]};
  opt.sampling.seed = 5;
  const std::vector<int32_t> stopped = generate(st, prompt, opt);
  const size_t first = std::find(a.begin(), a.end(), a[2]) - a.begin();
  EXPECT_EQ(stopped, std::vector<int32_t>(a.begin(), a.begin() + first + 1)) << "a stop token ends generation";
}

}  // namespace
}  // namespace lns
