// Initialisation rules per scheme, checked by sample statistics on a model large
// enough that the sample std is within ~1% of the true one (>= 9,000 draws per
// tensor; tolerance 4%), and layout independence: a stage draws the same weights
// as the whole model.
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "lns/core/rng.h"
#include "lns/model/stage.h"
#include "test_util.h"

namespace lns {
namespace {

using namespace lns::test;

LlamaConfig cfg_for(NormScheme s) {
  LlamaConfig c;
  c.vocab_size = 300, c.hidden_size = 96, c.intermediate_size = 160, c.num_layers = 6;
  c.num_heads = 4, c.num_kv_heads = 2, c.norm_scheme = s, c.init_std = 0.02f;
  c.embed_init_std = 0.5f, c.norm_type = NormType::LayerNorm;
  return c;
}

double sample_std(Tensor t) {
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < t.numel(); ++i) s += t.f32()[i], s2 += double(t.f32()[i]) * t.f32()[i];
  const double m = s / t.numel();
  return std::sqrt(s2 / t.numel() - m * m);
}

void expect_std(const LlamaStage& m, const std::string& name, double want) {
  const int i = m.params().find(name);
  ASSERT_GE(i, 0) << name;
  EXPECT_NEAR(sample_std(m.params().param(i)), want, 0.04 * want) << name;
}

TEST(Init, PreAndLnsUseInitStdEverywhere) {
  for (NormScheme s : {NormScheme::Pre, NormScheme::LNS}) {
    const LlamaConfig c = cfg_for(s);
    LlamaStage m(c, StageSpec::whole(c), 1, 4);
    m.init_weights(7);
    expect_std(m, "model.embed_tokens.weight", 0.5);
    expect_std(m, "lm_head.weight", 0.02);
    for (const char* p : {"self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"})
      expect_std(m, std::string("model.layers.3.") + p + ".weight", 0.02);
    const Tensor g = m.params().param(m.params().find("model.layers.3.input_layernorm.weight"));
    const Tensor b = m.params().param(m.params().find("model.layers.3.input_layernorm.bias"));
    for (int64_t i = 0; i < g.numel(); ++i) ASSERT_EQ(g.f32()[i], 1.0f);
    for (int64_t i = 0; i < b.numel(); ++i) ASSERT_EQ(b.f32()[i], 0.0f);
  }
}

TEST(Init, ScaledInitShrinksOutputProjections) {
  const LlamaConfig c = cfg_for(NormScheme::ScaledInit);
  LlamaStage m(c, StageSpec::whole(c), 1, 4);
  m.init_weights(7);
  const double scaled = 0.02 / std::sqrt(2.0 * c.num_layers);
  expect_std(m, "model.layers.0.self_attn.o_proj.weight", scaled);
  expect_std(m, "model.layers.5.mlp.down_proj.weight", scaled);
  expect_std(m, "model.layers.5.self_attn.q_proj.weight", 0.02);
  expect_std(m, "model.layers.5.mlp.up_proj.weight", 0.02);
}

TEST(Init, DeepNormXavierWithBeta) {
  const LlamaConfig c = cfg_for(NormScheme::DeepNorm);
  LlamaStage m(c, StageSpec::whole(c), 1, 4);
  m.init_weights(7);
  const double beta = std::pow(8.0 * c.num_layers, -0.25);
  const double C = c.hidden_size, F = c.intermediate_size, KD = c.kv_dim();
  expect_std(m, "model.layers.2.self_attn.q_proj.weight", std::sqrt(2.0 / (C + C)));
  expect_std(m, "model.layers.2.self_attn.k_proj.weight", std::sqrt(2.0 / (C + KD)));
  expect_std(m, "model.layers.2.self_attn.v_proj.weight", beta * std::sqrt(2.0 / (C + KD)));
  expect_std(m, "model.layers.2.self_attn.o_proj.weight", beta * std::sqrt(2.0 / (C + C)));
  expect_std(m, "model.layers.2.mlp.gate_proj.weight", beta * std::sqrt(2.0 / (C + F)));
  expect_std(m, "model.layers.2.mlp.down_proj.weight", beta * std::sqrt(2.0 / (C + F)));
  expect_std(m, "model.embed_tokens.weight", 0.5);
}

// The reference repository's rule (modeling_llama.py _init_weights, lines 857-878):
// std = initializer_range; Xavier-normal (gain * sqrt(2 / (fan_in + fan_out))) on the
// linears flagged is_deeppost_layer (v, o, gate, up, down: gain (8L)^(+1/4)) or
// is_deeppost_layer_qk (q, k: gain 1), normal(std / sqrt(2L)) on those flagged
// is_scaled_layer, normal(std) on the rest. Written here from that rule, for every
// matrix of every layer.
void expect_xavier_blocks(const LlamaStage& m, const LlamaConfig& c, double gain) {
  const double C = c.hidden_size, F = c.intermediate_size, KD = c.kv_dim();
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    expect_std(m, p + "self_attn.q_proj.weight", std::sqrt(2.0 / (C + C)));
    expect_std(m, p + "self_attn.k_proj.weight", std::sqrt(2.0 / (C + KD)));
    expect_std(m, p + "self_attn.v_proj.weight", gain * std::sqrt(2.0 / (C + KD)));
    expect_std(m, p + "self_attn.o_proj.weight", gain * std::sqrt(2.0 / (C + C)));
    for (const char* w : {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"})
      expect_std(m, p + w, gain * std::sqrt(2.0 / (C + F)));
  }
  expect_std(m, "lm_head.weight", c.init_std);
  expect_std(m, "model.embed_tokens.weight", c.embed_init_std);
}

TEST(Init, DeepPostIsTheRepositorysXavierWithThePositiveExponent) {
  const LlamaConfig c = cfg_for(NormScheme::DeepPost);
  LlamaStage m(c, StageSpec::whole(c), 1, 4);
  m.init_weights(7);
  expect_xavier_blocks(m, c, std::pow(8.0 * c.num_layers, 0.25));  // 2.63 at L = 6
}

TEST(Init, DeepPostCorrectedUsesDeepNetsGain) {
  const LlamaConfig c = cfg_for(NormScheme::DeepPostCorrected);
  LlamaStage m(c, StageSpec::whole(c), 1, 4);
  m.init_weights(7);
  expect_xavier_blocks(m, c, std::pow(8.0 * c.num_layers, -0.25));
}

TEST(Init, ScalePostPreShrinksOutputProjectionsOfItsPreLnLayersOnly) {
  LlamaConfig c = cfg_for(NormScheme::ScalePostPre);
  c.post_layers = 2;
  LlamaStage m(c, StageSpec::whole(c), 1, 4);
  m.init_weights(7);
  const double scaled = 0.02 / std::sqrt(2.0 * c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const double out = l < c.post_layers ? 0.02 : scaled;  // is_scaled_layer only at index >= POST_NUM
    expect_std(m, p + "self_attn.o_proj.weight", out);
    expect_std(m, p + "mlp.down_proj.weight", out);
    expect_std(m, p + "self_attn.q_proj.weight", 0.02);
    expect_std(m, p + "mlp.up_proj.weight", 0.02);
  }
}

TEST(Init, ScaleResPreNormBranchScalesStartAtOneThousandth) {
  LlamaConfig c = cfg_for(NormScheme::ScaleResPre);
  LlamaStage m(c, StageSpec::whole(c), 1, 4);
  m.init_weights(7);
  for (int l = 0; l < c.num_layers; ++l)
    for (const char* w : {".raw_scaling_factor_attn", ".raw_scaling_factor_mlp"}) {
      const int i = m.params().find("model.layers." + std::to_string(l) + w);
      ASSERT_GE(i, 0) << l << w;
      EXPECT_EQ(m.params().param(i).f32()[0], 0.001f);  // nn.Parameter(torch.tensor(0.001))
    }
  expect_std(m, "model.layers.4.self_attn.o_proj.weight", 0.02);
}

TEST(Init, StagesDrawTheWholeModelsWeightsAndSeedsDiffer) {
  const LlamaConfig c = cfg_for(NormScheme::LNS);
  LlamaStage whole(c, StageSpec::whole(c), 1, 4), part(c, {2, 5, false, false}, 1, 4),
      other(c, StageSpec::whole(c), 1, 4);
  whole.init_weights(11);
  part.init_weights(11);
  other.init_weights(12);
  ASSERT_EQ(part.params().size(), 3 * 11);  // 4 norm tensors + 7 matrices per layer
  for (int i = 0; i < part.params().size(); ++i) {
    const std::string& name = part.params().info(i).name;
    const Tensor a = part.params().param(i), b = whole.params().param(whole.params().find(name));
    ASSERT_EQ(std::memcmp(a.data, b.data, a.nbytes()), 0) << name;
  }
  const Tensor a = whole.params().param(0), b = other.params().param(0);
  EXPECT_NE(std::memcmp(a.data, b.data, a.nbytes()), 0) << "--seed must change the weights";
}

}  // namespace
}  // namespace lns

namespace lns {
namespace {

// The initial weights' bits, pinned: a 64-bit FNV-1a hash over every parameter, in
// ParamSet order, of the weights that seed 1234 draws for a small LNS model, and the
// same under tensor parallelism (padding rows zero). The values were taken from the
// serial initialiser (one element at a time) before it ran in parallel: start-up may
// get faster, the model it starts from must not change.
uint64_t fnv1a(const std::vector<const ParamSet*>& sets) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const ParamSet* p : sets)
    for (int i = 0; i < p->size(); ++i) {
      const Tensor t = p->host_param(i);
      const auto* b = reinterpret_cast<const unsigned char*>(t.f32());
      for (int64_t k = 0; k < t.numel() * 4; ++k) h = (h ^ b[k]) * 0x100000001b3ull;
    }
  return h;
}

TEST(Init, InitialWeightsArePinnedBitForBit) {
  LlamaConfig c = cfg_for(NormScheme::LNS);
  c.norm_type = NormType::RMSNorm, c.embed_init_std = 0.02f;
  LlamaStage whole(c, StageSpec::whole(c), 1, 4);
  whole.init_weights(1234);
  std::printf("[ init ] whole model: %016llx\n", (unsigned long long)fnv1a({&whole.params()}));
  EXPECT_EQ(fnv1a({&whole.params()}), 0xd9458fb50d40b5cdull);
  // Tensor parallelism over 2 ranks, FFN and vocabulary padded: each shard draws the
  // whole model's numbers at its logical indices.
  c.intermediate_size = 161, c.vocab_size = 301;
  std::vector<std::unique_ptr<LlamaStage>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::make_unique<LlamaStage>(c, StageSpec::whole(c), 1, 4, 1, TensorParallel{r, 2, nullptr}));
    ranks.back()->init_weights(1234);
  }
  std::printf("[ init ] tp=2 shards: %016llx\n", (unsigned long long)fnv1a({&ranks[0]->params(), &ranks[1]->params()}));
  EXPECT_EQ(fnv1a({&ranks[0]->params(), &ranks[1]->params()}), 0x3db8d039af7a687cull);
}

// fill_normal (lns_bench_kernels' operands: not constants, shaped like weights and
// activations) is the counter stream's normal_at, scaled and shifted, bit for bit at
// every index (the odd last one too, whatever the threads); its sample moments are those
// of normal(mean, std) in f64: n = 200,001 puts the mean's standard error at std / 447
// and the std's at 0.16% of std; the tolerances are over 6 standard errors.
TEST(Init, FillNormalIsTheCounterStreamScaled) {
  const int64_t n = 200001;
  const uint64_t key = rng_key(1234, "bench.w");
  for (const auto [mean, std] : {std::pair{0.0f, 0.02f}, std::pair{1.0f, 0.02f}, std::pair{0.0f, 1.0f}}) {
    std::vector<float> v(n);
    fill_normal(v.data(), n, mean, std, key);
    for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{12345}, n - 2, n - 1})
      EXPECT_EQ(v[i], mean + std * normal_at(key, uint64_t(i))) << "index " << i;
    double s = 0, s2 = 0;
    int64_t within = 0;
    for (float x : v) s += x, s2 += double(x) * x, within += std::fabs(x - mean) <= std;
    const double m = s / n, sd = std::sqrt(s2 / n - m * m);
    EXPECT_NEAR(m, mean, 6 * std / std::sqrt(double(n))) << "mean " << mean << " std " << std;
    EXPECT_NEAR(sd, std, 0.01 * std) << "mean " << mean << " std " << std;
    // P(|z| <= 1) = 0.6827; the fraction's standard error is 0.001
    EXPECT_NEAR(double(within) / n, 0.6827, 0.006) << "mean " << mean << " std " << std;
  }
  std::vector<float> a(1000), b(1000);
  fill_normal(a.data(), 1000, 0.0f, 1.0f, rng_key(1234, "bench.x"));
  fill_normal(b.data(), 1000, 0.0f, 1.0f, rng_key(1234, "bench.y"));
  int64_t same = 0;
  for (int i = 0; i < 1000; ++i) same += a[i] == b[i];
  EXPECT_LT(same, 5) << "two keys gave the same stream";
}

}  // namespace
}  // namespace lns
