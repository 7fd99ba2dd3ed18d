// The training loop's parts against hand computations: the LR schedule's exact
// values, an AdamW step written out in double, clipping, gradient accumulation
// (4 micro-batches of 1 = one micro-batch of 4), evaluation over exactly
// --eval_tokens targets, and a tiny model whose loss falls on real structure.
#include <unistd.h>

#include <cmath>
#include <cstring>

#include "lns/data/data.h"
#include "lns/core/ops.h"
#include "lns/model/fp8_state.h"
#include "lns/train/trainer.h"
#include "test_util.h"

namespace lns {
namespace {

using namespace lns::test;

TEST(LrSchedule, ExactValues) {
  const LrSchedule s{1e-3, 0.1, 100, 1100};
  EXPECT_DOUBLE_EQ(s.at(0), 1e-5);         // first warm-up step
  EXPECT_DOUBLE_EQ(s.at(49), 5e-4);        // half-way through warm-up
  EXPECT_DOUBLE_EQ(s.at(99), 1e-3);        // warm-up ends at the peak
  EXPECT_DOUBLE_EQ(s.at(100), 1e-3);       // decay starts at the peak
  EXPECT_NEAR(s.at(600), 0.55e-3, 1e-15);  // mid-decay: (max + min) / 2
  EXPECT_NEAR(s.at(350), 1e-4 + 0.9e-3 * 0.5 * (1 + std::cos(M_PI / 4)), 1e-15);
  EXPECT_DOUBLE_EQ(s.at(1100), 1e-4);      // the end: min_lr_ratio * max
  EXPECT_DOUBLE_EQ(s.at(5000), 1e-4);
  const LrSchedule none{2e-3, 0.0, 0, 10};
  EXPECT_DOUBLE_EQ(none.at(0), 2e-3);
  EXPECT_NEAR(none.at(10), 0.0, 1e-18);
}

TEST(AdamW, TwoStepsMatchHandComputation) {
  ParamSet ps;
  ps.add("m.weight", {2, 2}, ParamKind::Q, 0);   // a matrix: decays
  ps.add("m.norm", {3}, ParamKind::NormGain, 0);  // a vector: no decay
  ps.finalize();
  const std::vector<float> w0 = {0.5f, -1.0f, 2.0f, 0.0f, 1.0f, 1.0f, -0.5f};
  std::memcpy(ps.param(0).data, w0.data(), 16);
  std::memcpy(ps.param(1).data, w0.data() + 4, 12);
  AdamWConfig cfg{0.9f, 0.99f, 1e-8f, 0.1f};
  AdamW opt(ps, cfg);
  const std::vector<std::vector<float>> grads = {{0.1f, 0.2f, -0.3f, 0.4f, 1.0f, -2.0f, 0.0f},
                                                 {-0.2f, 0.1f, 0.3f, 0.0f, 0.5f, 0.5f, 0.25f}};
  const double lrs[2] = {0.01, 0.005};
  std::vector<double> w(w0.begin(), w0.end()), m(7, 0), v(7, 0);
  for (int t = 1; t <= 2; ++t) {
    const auto& g = grads[t - 1];
    std::memcpy(ps.grad(0).data, g.data(), 16);
    std::memcpy(ps.grad(1).data, g.data() + 4, 12);
    opt.step(static_cast<float>(lrs[t - 1]));
    for (int i = 0; i < 7; ++i) {
      const double wd = i < 4 ? 0.1 : 0.0;
      w[i] -= lrs[t - 1] * wd * w[i];
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.99 * v[i] + 0.01 * double(g[i]) * g[i];
      const double mhat = m[i] / (1 - std::pow(0.9, t)), vhat = v[i] / (1 - std::pow(0.99, t));
      w[i] -= lrs[t - 1] * mhat / (std::sqrt(vhat) + 1e-8);
    }
  }
  EXPECT_EQ(opt.steps_taken(), 2);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(ps.param(0).f32()[i], w[i], 2e-7) << i;
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(ps.param(1).f32()[i], w[4 + i], 2e-7) << i;
}

// The production path: GradientSync's norm (one rank here) and clip_factor.
TEST(GradClip, ScalesOnlyAboveTheThreshold) {
  ParamSet ps;
  ps.add("a", {2}, ParamKind::NormGain, 0);
  ps.add("b", {1, 2}, ParamKind::Q, 0);
  ps.finalize();
  const float g[4] = {3, 0, 0, 4};  // norm 5
  std::memcpy(ps.grad(0).data, g, 8);
  std::memcpy(ps.grad(1).data, g + 2, 8);
  const auto grid = ProcessGrid::single();
  GradientSync sync(*grid, ps, /*tied=*/false, /*bucket_mb=*/1);
  sync.reduce();
  const double n = sync.global_norm();
  EXPECT_DOUBLE_EQ(n, 5.0);
  EXPECT_EQ(clip_factor(n, 0.0), 1.0f);   // off
  EXPECT_EQ(clip_factor(n, 10.0), 1.0f);  // below
  EXPECT_EQ(clip_factor(n, 5.0), 1.0f);   // at
  const float f = clip_factor(n, 1.0);
  EXPECT_NEAR(f, 1.0 / (5.0 + 1e-6), 1e-7);
  sync.scale(f);
  EXPECT_NEAR(sync.global_norm(), 1.0, 1e-6);
  EXPECT_NEAR(ps.grad(1).f32()[1], 0.8f, 1e-6);
}

// A byte-level corpus of repeated English sentences: structure a tiny model learns fast.
std::string corpus_file(const std::string& name, int repeats) {
  const std::string text[] = {"the quick brown fox jumps over the lazy dog. ",
                              "a journey of a thousand miles begins with a single step. ",
                              "all that glitters is not gold. "};
  std::vector<int32_t> toks;
  std::vector<int64_t> docs = {0};
  for (int r = 0; r < repeats; ++r)
    for (const auto& s : text) {
      for (unsigned char ch : s) toks.push_back(ch);
      toks.push_back(256);
      docs.push_back(static_cast<int64_t>(toks.size()));
    }
  const std::string p = ::testing::TempDir() + "/lns_train_" + std::to_string(::getpid()) + name;
  write_token_file(p, toks, docs, 2, 257);
  return p;
}

LlamaConfig tiny_model() {
  LlamaConfig c;
  c.vocab_size = 257, c.hidden_size = 32, c.intermediate_size = 88, c.num_layers = 2;
  c.num_heads = 4, c.num_kv_heads = 2, c.norm_scheme = NormScheme::LNS;
  return c;
}

TEST(Trainer, AccumulatingFourMicroBatchesEqualsOneBatchOfFour) {
  TrainConfig tc;
  tc.data = corpus_file("accum", 40);
  tc.data_mode = SampleMode::Document;  // masked padding: the normaliser must be global
  tc.seq_len = 48, tc.global_batch = 4, tc.steps = 1;
  tc.micro_batch = 1;
  Trainer a(tiny_model(), tc);
  tc.micro_batch = 4;
  Trainer b(tiny_model(), tc);
  int64_t ta = 0, tb = 0;
  const double la = a.compute_gradients(&ta), lb = b.compute_gradients(&tb);
  EXPECT_EQ(ta, tb);
  EXPECT_LT(ta, 4 * 48) << "document mode should mask some targets";
  EXPECT_NEAR(la, lb, 1e-6 * lb);
  const Tensor ga = a.model().params().flat_grads(), gb = b.model().params().flat_grads();
  EXPECT_LE(rel_max_err(ga.f32(), gb.f32(), ga.numel()), 1e-5);
}

TEST(Trainer, EvaluatesExactlyEvalTokens) {
  TrainConfig tc;
  tc.data = tc.val_data = corpus_file("eval", 10);
  tc.seq_len = 4, tc.micro_batch = 2, tc.global_batch = 2, tc.eval_tokens = 10;
  Trainer tr(tiny_model(), tc);
  const EvalStats e = tr.evaluate();
  EXPECT_EQ(e.tokens, 10);
  // By hand: the first three packed sequences in order, the first 10 targets.
  auto corpus = TokenCorpus::open(tc.val_data);
  LlamaStage m(tiny_model(), StageSpec::whole(tiny_model()), 1, 4);
  m.init_weights(tc.seed);
  double sum = 0;
  for (int s = 0; s < 3; ++s) {
    std::vector<int32_t> tok(5);
    corpus->read(s * 4, 5, tok.data());
    std::vector<int32_t> in(tok.begin(), tok.begin() + 4), tg(tok.begin() + 1, tok.end());
    m.forward(view(in, {1, 4}));
    m.loss(view(tg, {4}));
    for (int t = 0; t < 4 && s * 4 + t < 10; ++t) sum += m.losses().f32()[t];
  }
  EXPECT_NEAR(e.loss, sum / 10, 1e-6);
  EXPECT_NEAR(e.ppl, std::exp(sum / 10), 1e-5 * e.ppl);
}

TEST(Trainer, TinyModelLossFalls) {
  // 60 steps of a 2-layer, width-32 LNS model on repeated sentences: the loss must
  // fall from ln(257) = 5.55 to below 2.5 (observed 2026-11-22: 5.53 -> 0.85).
  TrainConfig tc;
  tc.data = corpus_file("learn", 30);
  tc.seq_len = 32, tc.micro_batch = 8, tc.global_batch = 8, tc.steps = 60;
  tc.lr = 1e-2, tc.warmup_steps = 5, tc.grad_clip = 1.0;
  Trainer tr(tiny_model(), tc);
  const StepStats first = tr.train_step();
  StepStats last = first;
  for (int i = 1; i < tc.steps; ++i) last = tr.train_step();
  EXPECT_NEAR(first.loss, std::log(257.0), 0.3);
  EXPECT_LT(last.loss, 2.5) << "first " << first.loss;
  EXPECT_EQ(last.step, 60);
}

// --fp8=delayed on the tiny model: the loss follows the f32 run's within FP8's
// precision, and each step casts with the scale the previous step's amax gave
// (448 / amax for E4M3 inputs, 57344 / amax for E5M2 gradients).
TEST(Fp8Training, FollowsTheF32RunAndScalesFromThePreviousStepsAmax) {
  TrainConfig tc;
  tc.data = corpus_file("fp8", 30);
  tc.seq_len = 32, tc.micro_batch = 4, tc.global_batch = 8, tc.steps = 40;
  tc.lr = 1e-2, tc.warmup_steps = 5, tc.grad_clip = 1.0;
  LlamaConfig m = tiny_model();
  Trainer f32(m, tc);
  m.fp8 = Fp8Mode::Delayed;
  Trainer fp8(m, tc);
  ASSERT_NE(fp8.model().fp8(), nullptr);
  EXPECT_EQ(f32.model().fp8(), nullptr);
  std::vector<float> seen(2 * 7 * 3, 0.0f);  // each tensor's largest amax so far (the history's max)
  double worst = 0;
  for (int i = 0; i < tc.steps; ++i) {
    const StepStats a = f32.train_step(), b = fp8.train_step();
    const std::vector<Fp8Health>& h = fp8.model().fp8()->last_health();
    ASSERT_EQ(h.size(), seen.size());
    for (size_t r = 0; r < h.size(); ++r) {
      ASSERT_GT(h[r].elements, 0) << h[r].name;
      const double fmax = r % 3 == 2 ? 57344.0 : 448.0;
      const float want = i == 0 ? 1.0f : static_cast<float>(fmax / seen[r]);
      EXPECT_EQ(h[r].scale, want) << h[r].name << " step " << i + 1;
      seen[r] = std::max(seen[r], h[r].amax);
    }
    if (i == 0) {
      EXPECT_GT(std::abs(a.loss - b.loss), 1e-6) << "the FP8 run must not be the f32 run";
    }
    worst = std::max(worst, std::abs(a.loss - b.loss) / a.loss);
    if (i + 1 == tc.steps)
      std::printf("[ fp8 ] step %d: loss f32 %.4f, fp8 %.4f; worst relative gap over the run %.2e\n", i + 1, a.loss,
                  b.loss, worst);
  }
  // Observed 2026-11-28: f32 1.664, fp8 1.686 at step 40; the gap grows from 0 at step 1
  // to at most 3.7% (step 36) at this width (32) and lr (1e-2), where every GEMM sums
  // only 32 to 88 products of operands rounded to 3 (E4M3) or 2 (E5M2) mantissa bits.
  // A broken scale or cast moves the loss by far more (or to non-finite).
  EXPECT_LT(worst, 0.06);
}

// --fp8=blockwise trains beside f32 as closely, keeps no scale from step to step (its
// health reports scale 0: per tile) and saturates nothing (each tile's scale fits its
// largest value).
TEST(Fp8Training, BlockwiseFollowsTheF32Run) {
  TrainConfig tc;
  tc.data = corpus_file("fp8b", 30);
  tc.seq_len = 32, tc.micro_batch = 4, tc.global_batch = 8, tc.steps = 40;
  tc.lr = 3e-3, tc.warmup_steps = 5, tc.grad_clip = 1.0;
  LlamaConfig m = tiny_model();
  Trainer f32(m, tc);
  m.fp8 = Fp8Mode::Blockwise;
  Trainer fp8(m, tc);
  ASSERT_TRUE(fp8.model().fp8()->blockwise());
  EXPECT_TRUE(fp8.model().fp8()->state().empty());
  double worst = 0, first = 0;
  for (int i = 0; i < tc.steps; ++i) {
    const StepStats a = f32.train_step(), b = fp8.train_step();
    for (const Fp8Health& h : fp8.model().fp8()->last_health()) {
      ASSERT_GT(h.elements, 0) << h.name;
      EXPECT_EQ(h.scale, 0.0f) << h.name;
      EXPECT_EQ(h.saturated, 0) << h.name;
    }
    if (i == 0) first = std::abs(a.loss - b.loss);
    worst = std::max(worst, std::abs(a.loss - b.loss) / a.loss);
    if (i + 1 == tc.steps)
      std::printf("[ fp8 blockwise ] step %d: loss f32 %.4f, fp8 %.4f; worst relative gap over the run %.2e\n", i + 1,
                  a.loss, b.loss, worst);
  }
  EXPECT_GT(first, 1e-6) << "the FP8 run must not be the f32 run";
  // Observed 2026-11-28 at lr 3e-3: worst gap 9.0e-4 to 9.4e-4 under OpenBLAS's SkylakeX,
  // Haswell and Prescott kernels (loss 3.191 at step 40). At the delayed test's lr 1e-2
  // the run is chaotic enough that the gap is noise (5.6% there, 3.7% for delayed), so
  // this one trains gently and holds the gap to 10x what it showed.
  EXPECT_LT(worst, 0.01);
}

}  // namespace
}  // namespace lns
