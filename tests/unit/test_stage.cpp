// A model split into two stages at layer k computes exactly what the whole model
// computes: same logits, loss and gradients, bit for bit (the same ops run in the same
// order; only the tied-embedding gradient, summed across the two stages, is allowed
// f32 rounding). Covers LNS (the scale must use global layer numbers) and Mix-LN
// with the split inside and outside the Post-LN range.
#include <cstring>

#include "lns/model/stage.h"
#include "test_util.h"

namespace lns {
namespace {

using namespace lns::test;

LlamaConfig tiny(NormScheme scheme, bool tied) {
  LlamaConfig c;
  c.vocab_size = 29, c.hidden_size = 36, c.intermediate_size = 45, c.num_layers = 4;
  c.num_heads = 6, c.num_kv_heads = 3, c.norm_scheme = scheme, c.post_layers = 2;
  c.tie_embeddings = tied, c.init_std = 0.2f, c.embed_init_std = 1.0f;
  if (scheme == NormScheme::Hybrid)  // learned residual scales, deeppost, ... on both sides of a split
    c.layer_schemes = "scale_res_pre_norm,deeppost,*";
  return c;
}

std::vector<float> copy_of(Tensor t) { return {t.f32(), t.f32() + t.numel()}; }

struct SplitCase {
  NormScheme scheme;
  int k;
  bool tied;
};

class StageSplit : public ::testing::TestWithParam<SplitCase> {};

TEST_P(StageSplit, TwoStagesEqualTheWholeModel) {
  const auto [scheme, k, tied] = GetParam();
  const LlamaConfig cfg = tiny(scheme, tied);
  const int64_t B = 2, T = 5, N = B * T;
  std::vector<int32_t> ids(N), targets(N);
  for (int64_t i = 0; i < N; ++i) ids[i] = (7 * i + 3) % cfg.vocab_size;
  for (int64_t i = 0; i < N; ++i) targets[i] = i == 4 ? kIgnoreIndex : (5 * i + 1) % cfg.vocab_size;
  const float scale = 1.0f / (N - 1);

  LlamaStage whole(cfg, StageSpec::whole(cfg), B, T);
  whole.init_weights(42);
  whole.params().zero_grads();
  const auto logits_whole = copy_of(whole.forward(view(ids, {B, T})));
  const double loss_whole = whole.loss(view(targets, {N}));
  whole.backward({}, scale);

  LlamaStage first(cfg, {0, k, true, false}, B, T), last(cfg, {k, cfg.num_layers, false, true}, B, T);
  first.init_weights(42);
  last.init_weights(42);
  first.params().zero_grads();
  last.params().zero_grads();
  const Tensor hidden = first.forward(view(ids, {B, T}));
  ASSERT_EQ(hidden.shape, (Shape{B, T, cfg.hidden_size}));
  const auto logits_split = copy_of(last.forward(hidden));
  EXPECT_EQ(logits_split, logits_whole);
  EXPECT_EQ(last.loss(view(targets, {N})), loss_whole);
  {  // the per-token losses training reads once a step: loss() is their sum in token order
    const std::vector<float> tok = copy_of(last.loss_tokens(view(targets, {N})));
    double sum = 0.0;
    for (float v : tok) sum += v;
    EXPECT_EQ(sum, loss_whole);
    EXPECT_EQ(tok[4], 0.0f) << "an ignored target contributes 0";
  }
  const Tensor dhidden = last.backward({}, scale);
  ASSERT_EQ(first.backward(dhidden, scale).empty(), true);

  // Every parameter of the whole model lives on exactly one stage (the tied
  // embedding on both), with the same gradient.
  for (int i = 0; i < whole.params().size(); ++i) {
    const std::string& name = whole.params().info(i).name;
    const int a = first.params().find(name), b = last.params().find(name);
    ASSERT_TRUE(a >= 0 || b >= 0) << name;
    const auto want = copy_of(whole.params().grad(i));
    if (a >= 0 && b >= 0) {  // tied embedding: one gradient, summed across the stages
      auto sum = copy_of(first.params().grad(a));
      const auto other = copy_of(last.params().grad(b));
      for (size_t j = 0; j < sum.size(); ++j) sum[j] += other[j];
      expect_close(sum, want, 1e-6, name);
      EXPECT_EQ(copy_of(first.params().param(a)), copy_of(last.params().param(b)));
    } else {
      const ParamSet& ps = a >= 0 ? first.params() : last.params();
      EXPECT_EQ(copy_of(ps.grad(a >= 0 ? a : b)), want) << name;
      EXPECT_EQ(copy_of(ps.param(a >= 0 ? a : b)), copy_of(whole.params().param(i))) << name;
    }
  }
  EXPECT_EQ(first.params().size() + last.params().size(), whole.params().size() + (tied ? 1 : 0));
}

INSTANTIATE_TEST_SUITE_P(
    Splits, StageSplit,
    ::testing::Values(SplitCase{NormScheme::LNS, 1, false}, SplitCase{NormScheme::LNS, 3, true},
                      SplitCase{NormScheme::Mix, 1, false},   // split inside the post range
                      SplitCase{NormScheme::Mix, 2, false},   // split at its edge
                      SplitCase{NormScheme::Mix, 3, true},    // split in the pre range
                      SplitCase{NormScheme::Hybrid, 1, false},
                      SplitCase{NormScheme::Hybrid, 2, true},
                      // the repository's mono_reverse: doubled-norm post layers, then the routed layer 3
                      SplitCase{NormScheme::MonoReverse, 2, false}));

// Interleaved pipeline: one stage holding the model as three chunks (embedding before
// the first, head after the last), two micro-batches in flight per chunk in the
// interleaved order, computes the whole model's logits, losses, gradients and
// per-layer statistics bit for bit, with its parameters in the whole model's order.
TEST(StageChunks, ChunksInInterleavedOrderEqualTheWholeModel) {
  const LlamaConfig cfg = tiny(NormScheme::Mix, true);
  const int64_t B = 2, T = 5, N = B * T;
  std::vector<int32_t> ids[2], targets[2];
  for (int m = 0; m < 2; ++m) {
    ids[m].resize(N), targets[m].resize(N);
    for (int64_t i = 0; i < N; ++i) ids[m][i] = (7 * i + 3 + 11 * m) % cfg.vocab_size;
    for (int64_t i = 0; i < N; ++i) targets[m][i] = (5 * i + 1 + 3 * m) % cfg.vocab_size;
  }
  const float scale = 1.0f / (2 * N);

  LlamaStage whole(cfg, StageSpec::whole(cfg), B, T);
  whole.init_weights(42);
  whole.params().zero_grads();
  std::vector<float> logits_whole[2];
  double loss_whole[2];
  std::vector<LlamaStage::LayerStats> stats_whole;
  for (int m = 0; m < 2; ++m) {
    logits_whole[m] = copy_of(whole.forward(view(ids[m], {B, T})));
    if (m == 1) stats_whole = whole.layer_stats();
    loss_whole[m] = whole.loss(view(targets[m], {N}));
    whole.backward({}, scale);
  }

  StageSpec spec(0, 1, true, true);
  spec.chunks = {{0, 1}, {1, 3}, {3, 4}};
  LlamaStage chunked(cfg, spec, B, T, std::vector<int>{2, 2, 2});
  ASSERT_EQ(chunked.num_chunks(), 3);
  chunked.init_weights(42);
  chunked.params().zero_grads();
  ASSERT_EQ(chunked.params().size(), whole.params().size());
  for (int i = 0; i < whole.params().size(); ++i)
    ASSERT_EQ(chunked.params().info(i).name, whole.params().info(i).name) << "the whole model's order";
  // Forwards of both micro-batches chunk by chunk (slot m), then backwards last chunk first.
  Tensor h[2];
  for (int c = 0; c < 3; ++c)
    for (int m = 0; m < 2; ++m) {
      const Tensor out = chunked.forward(c == 0 ? view(ids[m], {B, T}) : h[m], m, c);
      if (c < 2) {
        ASSERT_EQ(out.shape, (Shape{B, T, cfg.hidden_size}));
        h[m] = out;
      } else {
        EXPECT_EQ(copy_of(out), logits_whole[m]) << "micro-batch " << m;
      }
    }
  EXPECT_EQ(chunked.layer_stats(1).size(), stats_whole.size());
  for (size_t l = 0; l < stats_whole.size(); ++l) {
    const LlamaStage::LayerStats got = chunked.layer_stats(1)[l];
    EXPECT_EQ(got.layer, stats_whole[l].layer);
    EXPECT_EQ(got.sum_sq, stats_whole[l].sum_sq) << l;
    EXPECT_EQ(got.angle, stats_whole[l].angle) << l;
  }
  for (int m = 0; m < 2; ++m) EXPECT_EQ(chunked.loss(view(targets[m], {N}), m), loss_whole[m]);
  // The hidden gradients live in the stage's scratch: copy each before the next backward.
  std::vector<float> dh[2];
  for (int c = 2; c >= 0; --c)
    for (int m = 0; m < 2; ++m) {
      const Tensor din = chunked.backward(c == 2 ? Tensor{} : view(dh[m], {B, T, cfg.hidden_size}), scale, m, c);
      if (c > 0) dh[m] = copy_of(din);
      else EXPECT_TRUE(din.empty());
    }
  // Each parameter adds micro-batch 0, then 1, as the whole model does: the same bits;
  // but the tied embedding, whose head part (last chunk) now adds both micro-batches
  // before its lookup part (first chunk) does: equal to f32 rounding.
  for (int i = 0; i < whole.params().size(); ++i) {
    const std::string& name = whole.params().info(i).name;
    if (name == "model.embed_tokens.weight")
      expect_close(copy_of(chunked.params().grad(i)), copy_of(whole.params().grad(i)), 1e-6, name);
    else
      EXPECT_EQ(copy_of(chunked.params().grad(i)), copy_of(whole.params().grad(i))) << name;
  }
}

// LN-free: with fixed divisors on some pre-norms and the final norm, the stage's
// gradients (through the parameters and, via the embedding, through every fixed norm's
// dx) match central finite differences of its loss.
TEST(LnFreeStage, FixedDivisorGradientsMatchFiniteDifferences) {
  for (const bool layer_norm : {false, true}) {
    LlamaConfig cfg = tiny(layer_norm ? NormScheme::LNS : NormScheme::Pre, false);
    if (layer_norm) cfg.norm_type = NormType::LayerNorm;
    const int64_t B = 2, T = 5, N = B * T;
    std::vector<int32_t> ids(N), targets(N);
    for (int64_t i = 0; i < N; ++i) ids[i] = (7 * i + 3) % cfg.vocab_size;
    for (int64_t i = 0; i < N; ++i) targets[i] = (5 * i + 1) % cfg.vocab_size;
    LlamaStage st(cfg, StageSpec::whole(cfg), B, T);
    st.init_weights(7);
    st.forward(view(ids, {B, T}));
    const double live_loss = st.loss(view(targets, {N}));
    st.set_fixed_divisor(0, 1, 3.0f, 1.5f);   // MLP pre-norm of layer 0
    st.set_fixed_divisor(2, 0, 2.0f, 0.8f);   // attention pre-norm of layer 2
    st.set_fixed_divisor(cfg.num_layers, 0, 4.0f, 2.5f);  // final norm
    EXPECT_THROW(st.set_fixed_divisor(1, 0, 0.0f, 1.0f), UserError);
    EXPECT_THROW(st.set_fixed_divisor(9, 0, 1.0f, 1.0f), UserError);
    auto loss_now = [&] {
      st.forward(view(ids, {B, T}));
      return st.loss(view(targets, {N}));
    };
    st.params().zero_grads();
    const double loss0 = loss_now();
    EXPECT_GT(std::abs(loss0 - live_loss), 1e-3);  // the constants do change the function
    st.backward({}, 1.0f);
    for (const char* name : {"model.embed_tokens.weight", "model.layers.0.post_attention_layernorm.weight",
                             "model.layers.2.input_layernorm.weight", "model.layers.1.self_attn.q_proj.weight",
                             "model.norm.weight"}) {
      const int p = st.params().find(name);
      ASSERT_GE(p, 0) << name;
      float* w = st.params().param(p).f32();
      const float* g = st.params().grad(p).f32();
      const int64_t idx[] = {3 * cfg.hidden_size + 1, 5, 17};  // row 3 of the embedding is used
      for (int64_t i : idx) {
        const float keep = w[i], h = 1e-2f;
        w[i] = keep + h;
        const double up = loss_now();
        w[i] = keep - h;
        const double down = loss_now();
        w[i] = keep;
        const double want = (up - down) / (2.0 * h);
        EXPECT_NEAR(g[i], want, 2e-3 + 2e-2 * std::abs(want)) << name << "[" << i << "] ln=" << layer_norm;
      }
    }
  }
}

// Calibration measures the divisors the live norms use: on one sequence of two tokens
// (one row per position group), fixing every pre-norm and the final norm at the
// measured constants leaves the logits as they were (f32 rounding aside).
TEST(LnFreeStage, CalibratedConstantsReproduceTheLiveModel) {
  for (const bool layer_norm : {false, true}) {
    LlamaConfig cfg = tiny(layer_norm ? NormScheme::LNS : NormScheme::Pre, false);
    if (layer_norm) cfg.norm_type = NormType::LayerNorm;
    const int64_t B = 1, T = 2;
    std::vector<int32_t> ids = {4, 11};
    LlamaStage st(cfg, StageSpec::whole(cfg), B, T);
    st.init_weights(3);
    const auto live = copy_of(st.forward(view(ids, {B, T})));
    std::vector<std::array<double, 4>> sums;
    st.add_divisor_sums(sums);
    ASSERT_EQ(sums.size(), size_t(2 * cfg.num_layers + 1));
    for (const auto& e : sums) {
      ASSERT_EQ(e[1], 1.0);
      ASSERT_EQ(e[3], 1.0);
    }
    for (int l = 0; l <= cfg.num_layers; ++l)
      for (int w = 0; w < (l < cfg.num_layers ? 2 : 1); ++w) {
        const auto& e = sums[2 * l + w];
        st.set_fixed_divisor(l, w, float(e[0] / e[1]), float(e[2] / e[3]));
      }
    const auto fixed = copy_of(st.forward(view(ids, {B, T})));
    expect_close(fixed, std::vector<double>(live.begin(), live.end()), 1e-5, "logits");
    // a 2% different final-norm constant moves them (the comparison can fail)
    st.set_fixed_divisor(cfg.num_layers, 0, float(sums.back()[0] * 1.02), float(sums.back()[2]));
    const auto moved = copy_of(st.forward(view(ids, {B, T})));
    double diff = 0;
    for (size_t i = 0; i < moved.size(); ++i) diff = std::max(diff, double(std::abs(moved[i] - live[i])));
    EXPECT_GT(diff, 1e-3);
  }
}

TEST(BlockPlan, SchemesOwnExactlyTheirNorms) {
  auto names = [](NormScheme s, int layer) {
    LlamaConfig c = tiny(s, false);
    std::vector<std::string> out;
    for (NormSlot n : block_plan(c, layer).norms()) out.push_back(norm_slot_name(n));
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(names(NormScheme::Pre, 0), (V{"input_layernorm", "post_attention_layernorm"}));
  EXPECT_EQ(names(NormScheme::Post, 0), (V{"post_attention_layernorm", "post_feedforward_layernorm"}));
  EXPECT_EQ(names(NormScheme::Mix, 1), names(NormScheme::Post, 1));  // 1 < post_layers = 2
  EXPECT_EQ(names(NormScheme::Mix, 2), names(NormScheme::Pre, 2));
  EXPECT_EQ(names(NormScheme::Sandwich, 3),
            (V{"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
               "post_feedforward_layernorm"}));
  EXPECT_EQ(names(NormScheme::DeepNorm, 2), names(NormScheme::Post, 2));
}

TEST(BlockPlan, DepthValuesComeFromTheGlobalLayer) {
  LlamaConfig c = tiny(NormScheme::LNS, false);
  c.num_layers = 24;
  for (int g : {0, 12, 23}) {
    const BlockPlan p = block_plan(c, g);
    EXPECT_FLOAT_EQ(p.attn.pre_scale, 1.0f / std::sqrt(float(g + 1)));
    EXPECT_FLOAT_EQ(p.mlp.pre_scale, 1.0f / std::sqrt(float(g + 1)));
  }
  c.norm_scheme = NormScheme::DeepNorm;
  EXPECT_FLOAT_EQ(block_plan(c, 5).attn.residual_alpha, std::pow(48.0f, 0.25f));
  c.norm_scheme = NormScheme::Pre;
  EXPECT_EQ(block_plan(c, 5).attn.pre_scale, 1.0f);
}

}  // namespace
}  // namespace lns
