// Parallel layouts against the single-rank model, run under mpirun by ctest:
//   mpirun -np N lns_mpi_tests --tp=T --pp=P [--virtual_stages=V --test_layers=L] [--zero]
//                              [--device=cuda --comm=mpi]
// Rank 0 also computes the single-rank reference in-process (a local grid, no MPI),
// so every comparison is layout vs one rank on identical data and weights.
// Tolerance: 1e-5 relative to each tensor's largest entry on the CPU (the sums of a
// tensor-parallel or data-parallel reduction associate differently); 3e-2 on CUDA,
// where a tensor-parallel all-reduce sums bf16 partial results that one rank keeps
// in f32 inside its GEMM (one extra bf16 rounding per reduced activation). With
// --device=cuda every rank shares GPU local_rank mod GPUs; without a GPU the binary
// exits 77, which ctest reports as skipped. Measured worst cases: docs/parallelism.md.
#include <gflags/gflags.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <map>

#include "lns/data/data.h"
#include "lns/core/device.h"
#include "lns/core/errors.h"
#include "lns/model/fp8_state.h"
#include "lns/checkpoint/safetensors.h"
#include "lns/train/train_flags.h"
#include "lns/train/trainer.h"
#include "parallel/process_grid.h"

DECLARE_bool(zero);
DECLARE_bool(sequence_parallel);
DECLARE_double(dp_bucket_mb);
DECLARE_string(device);
DECLARE_int32(virtual_stages);
DEFINE_int32(test_layers, 7, "Layers of the test model (pp x virtual_stages chunks need as many).");

namespace lns {
namespace {

ProcessGrid* g_grid = nullptr;
Device g_device = Device::CPU;
double kTol = 1e-5;

// Odd sizes on purpose: FFN 45 and vocabulary 53 pad under tp = 2; 7 layers split
// unevenly over 2 or 3 stages (or 4 or 6 model chunks; --test_layers=9 over 8);
// GQA with 4 query and 2 key-value heads (4 and 4 under tp = 4, which needs the
// key-value heads to divide).
LlamaConfig model(NormScheme scheme, bool tied, NormType norm = NormType::RMSNorm) {
  LlamaConfig c;
  c.norm_type = norm;
  c.vocab_size = 53, c.hidden_size = 32, c.intermediate_size = 45, c.num_layers = FLAGS_test_layers;
  c.num_heads = 4, c.num_kv_heads = g_grid->layout.tp > 2 ? 4 : 2, c.norm_scheme = scheme, c.post_layers = 3;
  c.tie_embeddings = tied, c.init_std = 0.1f, c.embed_init_std = 0.5f;
  // pre, scale_res_pre_norm, deeppost, routed, sandwich, pre, scale_res_pre_norm: each
  // form of the reference repository's variants, a split on either side; the routed
  // block's training noise keyed by sample, the same under every layout
  if (scheme == NormScheme::Hybrid) c.layer_schemes = "pre,scale_res_pre_norm,deeppost,routed,sandwich,*";
  // Sequence parallelism refuses routed blocks (their gate reads whole sequences).
  if (scheme == NormScheme::Hybrid && FLAGS_sequence_parallel) c.layer_schemes = "pre,scale_res_pre_norm,deeppost,sandwich,*";
  return c;
}

std::string g_corpus;

// A corpus of documents of varied length, written once by rank 0 before the tests
// (the single-rank references on rank 0 must not call collectives).
std::string write_corpus() {
  const std::string path = ::testing::TempDir() + "/lns_mpi_corpus_" + std::to_string(::getppid()) + ".tok";
  if (g_grid->rank == 0) {
    std::vector<int32_t> toks;
    std::vector<int64_t> docs = {0};
    for (int d = 0; d < 200; ++d) {
      for (int i = 0; i < 3 + (d * 7) % 17; ++i) toks.push_back((d * 31 + i * 7) % 53);
      docs.push_back(static_cast<int64_t>(toks.size()));
    }
    write_token_file(path, toks, docs, 2, 53);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

TrainConfig train(SampleMode mode) {
  TrainConfig t;
  t.data = g_corpus;
  t.data_mode = mode;
  t.seq_len = 8, t.micro_batch = 2, t.global_batch = 8, t.steps = 5;
  t.lr = 1e-2, t.warmup_steps = 1, t.grad_clip = 0.5;  // clipping active: the norm must be right
  t.adam.weight_decay = 0.1f;
  t.zero = FLAGS_zero;
  t.sequence_parallel = FLAGS_sequence_parallel;
  t.dp_bucket_mb = FLAGS_dp_bucket_mb;
  t.virtual_stages = FLAGS_virtual_stages;
  t.device = g_device;
  return t;
}

// The single-rank reference of a layout's run: one stage, one chunk.
TrainConfig one_rank(TrainConfig t) {
  t.virtual_stages = 1;
  return t;
}

// The layout's step (`got_path`, this rank's dump) against the single rank's, run here
// (rank 0 only) from the same model and data: each tensor within kTol of its scale.
// A tensor's scale is its largest entry, except for a scalar gradient (a learned
// residual scale's: one sum over every token and feature, sum(dr * x)). The layout
// changes dr and x by rounding, kTol of the layer's gradients' size, and the sum
// cancels most of its terms, so the scalar moves by kTol of the terms, not of the
// sum (measured: 1.4e-5 of its own size under tp = 2 with OpenBLAS's generic kernel).
// Its scale is therefore the largest gradient entry of its layer, the size of what it
// is summed from. A layout bug moves a tensor by orders of magnitude more.
void compare_to_single_rank(const std::string& got_path, const LlamaConfig& c, TrainConfig t) {
  const std::string want_path = got_path + ".single.safetensors";
  t.virtual_stages = 1;
  Trainer(c, t).dump_step_state(want_path);
  SafetensorsReader got(got_path), want(want_path);
  ASSERT_EQ(got.entries().size(), want.entries().size());
  auto layer_of = [](const std::string& name) {  // "grad.model.layers.3." or ""
    const std::string pre = "grad.model.layers.";
    if (name.rfind(pre, 0) != 0) return std::string();
    return name.substr(0, name.find('.', pre.size()) + 1);
  };
  std::map<std::string, double> layer_scale;
  for (const auto& [name, e] : want.entries())
    if (e.dtype == "F32" && !layer_of(name).empty())
      for (float v : want.read_f32(name)) layer_scale[layer_of(name)] = std::max<double>(layer_scale[layer_of(name)], std::abs(v));
  double worst = 0;
  for (const auto& [name, e] : want.entries()) {
    ASSERT_TRUE(got.has(name)) << name;
    ASSERT_EQ(got.entry(name).shape, e.shape) << name;
    if (e.dtype == "I32") {
      EXPECT_EQ(got.read_i32(name), want.read_i32(name)) << name;
      continue;
    }
    const auto a = got.read_f32(name), b = want.read_f32(name);
    double err = 0, scale = 1e-30;
    for (size_t i = 0; i < a.size(); ++i)
      err = std::max(err, std::abs(double(a[i]) - b[i])), scale = std::max(scale, std::abs(double(b[i])));
    if (a.size() == 1 && !layer_of(name).empty()) scale = std::max(scale, layer_scale[layer_of(name)]);
    EXPECT_LE(err / scale, kTol) << name;
    worst = std::max(worst, err / scale);
  }
  std::printf("[ layout ] %s: worst relative error %.2e over %zu tensors\n", g_grid->layout.brief().c_str(), worst,
              want.entries().size());
}

struct Case {
  NormScheme scheme;
  bool tied;
  SampleMode mode;
  NormType norm = NormType::RMSNorm;
};

// Tolerance of the five-step comparison: reduction-order differences grow with each
// optimizer step; under tp = 4 sandwich's fifth gradient norm is off by 1.7e-5
// relative (measured, with and without sequence parallelism), so 3e-5 there.
double five_step_tol() { return g_grid->layout.tp > 2 ? std::max(kTol, 3e-5) : kTol; }

class Layout : public ::testing::TestWithParam<Case> {};

TEST_P(Layout, StepDumpEqualsSingleRank) {
  const Case c = GetParam();
  const std::string dir = ::testing::TempDir() + "/lns_mpi_" + std::to_string(::getppid());
  const std::string got = dir + "_layout.safetensors";
  Trainer(model(c.scheme, c.tied, c.norm), train(c.mode), g_grid).dump_step_state(got);
  if (g_grid->rank != 0) return;
  compare_to_single_rank(got, model(c.scheme, c.tied, c.norm), train(c.mode));
}

TEST_P(Layout, FiveStepsOfLossesEqualSingleRank) {
  const Case c = GetParam();
  Trainer t(model(c.scheme, c.tied, c.norm), train(c.mode), g_grid);
  std::vector<StepStats> got;
  for (int i = 0; i < 5; ++i) got.push_back(t.train_step());
  if (g_grid->rank != 0) return;
  Trainer single(model(c.scheme, c.tied, c.norm), one_rank(train(c.mode)));
  const double tol = five_step_tol();
  for (int i = 0; i < 5; ++i) {
    const StepStats want = single.train_step();
    EXPECT_NEAR(got[i].loss, want.loss, tol * want.loss) << "step " << i + 1;
    EXPECT_NEAR(got[i].grad_norm, want.grad_norm, tol * want.grad_norm) << "step " << i + 1;
    EXPECT_EQ(got[i].tokens, want.tokens);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Schemes, Layout,
    ::testing::Values(Case{NormScheme::LNS, false, SampleMode::Packed},
                      Case{NormScheme::Mix, true, SampleMode::Document},
                      Case{NormScheme::Sandwich, true, SampleMode::Packed},
                      Case{NormScheme::Hybrid, false, SampleMode::Packed}),
    [](const auto& info) {
      return std::string(norm_scheme_name(info.param.scheme)) + (info.param.tied ? "_tied" : "") +
             (info.param.mode == SampleMode::Document ? "_document" : "");
    });

// LN-free fine-tuning under the layout: the whole recipe (every slot, the end-of-text
// and position-0 cases and their drops) with calibration on each stage and each of its
// model chunks (--virtual_stages), summed over the data-parallel ranks and, under
// --sequence_parallel, over the tp ranks' shares of the tokens (tp = 4: shares that start
// mid-sequence): the same constants and the same losses as one rank.
class LnFreeLayout : public ::testing::TestWithParam<NormType> {};

TEST_P(LnFreeLayout, ScheduleEqualsSingleRank) {
  // LayerNorm runs Pre-LN, except in the deep layouts (--test_layers > 7): a fresh Pre-LN
  // model whose norms all become constants blows up with depth (measured: loss 149 at 9
  // layers, NaN at step 8 with 13), where LNS's depth scale keeps it finite.
  const bool pre = GetParam() == NormType::LayerNorm && FLAGS_test_layers <= 7;
  LlamaConfig cfg = model(pre ? NormScheme::Pre : NormScheme::LNS, false);
  cfg.norm_type = GetParam();
  TrainConfig t = train(SampleMode::Packed);
  t.steps = 8;
  t.ln_free = "mlp@1,attn_qk@+1,attn_v:eot@+1,final@+1,drop_eot@+1,drop_pos0@+1";
  t.ln_free_eot_token = 7;  // (d*31 + i*7) % 53: present in the corpus
  t.ln_free_calib_tokens = 40;  // 5 sequences: 3 micro-batches of 2, split over dp
  t.ln_free_loss_window = 2;
  // A fresh model has no stable divisors to fix: a small step keeps the last steps' loss
  // (after drop_pos0) far from the chaotic growth that would amplify rounding differences.
  t.lr = 1e-3;
  Trainer par(cfg, t, g_grid);
  std::vector<StepStats> got;
  for (int i = 0; i < t.steps; ++i) got.push_back(par.train_step());
  const LnFreeState st = par.ln_free();
  if (g_grid->rank != 0) return;
  Trainer one(cfg, one_rank(t));
  for (int i = 0; i < t.steps; ++i) {
    const StepStats want = one.train_step();
    EXPECT_NEAR(got[i].loss, want.loss, kTol * want.loss) << "step " << i + 1;
    EXPECT_NEAR(got[i].grad_norm, want.grad_norm, kTol * want.grad_norm) << "step " << i + 1;
    if (i == t.steps - 1) std::printf("[ ln_free ] step %d loss %.6f (single rank %.6f)\n", i + 1, got[i].loss, want.loss);
  }
  const LnFreeState& want = one.ln_free();
  EXPECT_EQ(want.progress.next_event, 6);
  ASSERT_EQ(st.norms.size(), want.norms.size());
  ASSERT_EQ(want.norms.size(), size_t(3 * cfg.num_layers + 1));
  for (size_t i = 0; i < want.norms.size(); ++i) {
    const FixedNorm &a = st.norms[i], &b = want.norms[i];
    EXPECT_EQ(a.layer, b.layer);
    EXPECT_EQ(a.slot, b.slot);
    EXPECT_EQ(a.step, b.step);
    EXPECT_NEAR(a.pos0, b.pos0, kTol * b.pos0) << i;
    EXPECT_NEAR(a.rest, b.rest, kTol * b.rest) << i;
  }
  EXPECT_FALSE(st.pos0_special);
}

INSTANTIATE_TEST_SUITE_P(NormTypes, LnFreeLayout, ::testing::Values(NormType::RMSNorm, NormType::LayerNorm),
                         [](const auto& info) { return info.param == NormType::LayerNorm ? "layernorm" : "rmsnorm"; });

// Pre-LN and Post-LN with LayerNorm (replicated biases as well as gains), run by the
// sequence-parallel layouts, where every norm sits in the split region; the other
// layouts skip them to keep their CI time.
class MoreLayout : public Layout {
 protected:
  void SetUp() override {
    if (!FLAGS_sequence_parallel) GTEST_SKIP() << "run by the --sequence_parallel layouts";
  }
};
TEST_P(MoreLayout, StepDumpEqualsSingleRank) {
  const Case c = GetParam();
  const std::string dir = ::testing::TempDir() + "/lns_mpi_more_" + std::to_string(::getppid());
  const std::string got = dir + "_layout.safetensors";
  Trainer(model(c.scheme, c.tied, c.norm), train(c.mode), g_grid).dump_step_state(got);
  if (g_grid->rank != 0) return;
  compare_to_single_rank(got, model(c.scheme, c.tied, c.norm), train(c.mode));
}
INSTANTIATE_TEST_SUITE_P(SpSchemes, MoreLayout,
                         ::testing::Values(Case{NormScheme::Pre, false, SampleMode::Packed},
                                           Case{NormScheme::Post, true, SampleMode::Document, NormType::LayerNorm}),
                         [](const auto& info) {
                           return std::string(norm_scheme_name(info.param.scheme)) +
                                  (info.param.norm == NormType::LayerNorm ? "_layernorm" : "");
                         });

// Sequence parallelism refuses a sequence length that tp does not divide, on every
// rank, with one line naming both flags (a pure check: no rank waits for another).
// --fp8=delayed: every rank casts with the single rank's scales (the step's amax is a
// max over micro-batches, tp and dp ranks), so the layout's losses follow the single
// rank's. Tolerance 1e-5 as the f32 layouts: the layout's reductions move a value by
// ~1e-7, which could flip the FP8 rounding of an element that close to a rounding
// boundary; measured over five steps: at most 2.2e-8 (tp = 2, pp = 2, dp = 2). Without
// the amax reduction over tp the scales differ by far more than their 1e-5.
TEST(Fp8, FiveStepsOfLossesAndScalesEqualSingleRank) {
  LlamaConfig c = model(NormScheme::LNS, false);
  c.fp8 = Fp8Mode::Delayed;
  Trainer t(c, train(SampleMode::Packed), g_grid);
  std::vector<StepStats> got;
  for (int i = 0; i < 5; ++i) got.push_back(t.train_step());
  const std::vector<Fp8Health> health = t.model().fp8()->last_health();
  if (g_grid->rank != 0) return;
  Trainer single(c, one_rank(train(SampleMode::Packed)));
  double worst = 0;
  for (int i = 0; i < 5; ++i) {
    const StepStats want = single.train_step();
    EXPECT_NEAR(got[i].loss, want.loss, 1e-5 * want.loss) << "step " << i + 1;
    EXPECT_NEAR(got[i].grad_norm, want.grad_norm, 1e-5 * want.grad_norm) << "step " << i + 1;
    worst = std::max(worst, std::abs(got[i].loss - want.loss) / want.loss);
  }
  std::map<std::string, Fp8Health> one;
  for (const Fp8Health& h : single.model().fp8()->last_health()) one[h.name] = h;
  ASSERT_FALSE(health.empty());
  for (const Fp8Health& h : health) {
    ASSERT_TRUE(one.count(h.name)) << h.name;
    EXPECT_NEAR(h.scale, one[h.name].scale, 1e-5 * one[h.name].scale) << h.name;
    EXPECT_NEAR(h.amax, one[h.name].amax, 1e-5 * one[h.name].amax) << h.name;
  }
  std::printf("[ layout ] %s fp8: worst relative loss error %.2e over 5 steps\n", g_grid->layout.brief().c_str(), worst);
}

TEST(SequenceParallel, RefusesSeqLenNotDivisibleByTp) {
  if (!FLAGS_sequence_parallel || g_grid->layout.tp == 1) GTEST_SKIP() << "needs --sequence_parallel and --tp > 1";
  TrainConfig t = train(SampleMode::Packed);
  t.seq_len = 2 * g_grid->layout.tp + 1;
  try {
    Trainer(model(NormScheme::LNS, false), t, g_grid);
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "--sequence_parallel needs --seq_len divisible by --tp, got --seq_len=" +
                                         std::to_string(t.seq_len) + " and --tp=" + std::to_string(g_grid->layout.tp) +
                                         " (pick a --seq_len that is a multiple of " +
                                         std::to_string(g_grid->layout.tp) + ", or drop --sequence_parallel)");
  }
}

// Activation recomputation under this layout: two steps give, bitwise on the CPU, the
// losses, gradient norms and weights (each rank's shard) of the same layout without it;
// with the tests above, so the single rank's. Hybrid: every block form, split unevenly.
TEST(Recompute, LayoutStepsAreBitwiseTheStepsWithout) {
  auto run = [&](RecomputeMode mode, int layers) {
    LlamaConfig c = model(NormScheme::Hybrid, false);
    c.recompute = mode, c.recompute_layers = layers;
    TrainConfig tc = train(SampleMode::Packed);
    tc.steps = 2;
    Trainer t(c, tc, g_grid);
    std::vector<float> out;
    for (int i = 0; i < 2; ++i) {
      const StepStats s = t.train_step();
      out.push_back(static_cast<float>(s.loss)), out.push_back(static_cast<float>(s.grad_norm));
    }
    for (int i = 0; i < t.model().params().size(); ++i) {
      const std::vector<float> w = to_host_f32(t.model().params().param(i));
      out.insert(out.end(), w.begin(), w.end());
    }
    return out;
  };
  const std::vector<float> want = run(RecomputeMode::None, 0);
  for (auto [mode, layers] : {std::pair{RecomputeMode::Selective, 0}, std::pair{RecomputeMode::Full, 0},
                              std::pair{RecomputeMode::Full, 1}}) {
    const std::vector<float> got = run(mode, layers);
    ASSERT_EQ(got.size(), want.size());
    if (g_device == Device::CPU) {
      EXPECT_EQ(got, want) << recompute_mode_name(mode) << " " << layers;
    } else {
      double err = 0, scale = 1e-30;
      for (size_t i = 0; i < got.size(); ++i)
        err = std::max(err, std::abs(double(got[i]) - want[i])), scale = std::max(scale, std::abs(double(want[i])));
      EXPECT_LE(err / scale, kTol) << recompute_mode_name(mode) << " " << layers;
    }
  }
}

// Starting each data-parallel bucket inside the last backward, as soon as the stage
// reports its gradients final, gives the bits of reducing after backward: a bucket
// started one layer too early would miss that layer's gradient.
TEST(Overlap, BucketsStartedDuringBackwardEqualReducingAfter) {
  std::vector<std::vector<float>> weights;
  std::vector<double> losses;
  for (bool overlap : {false, true}) {
    TrainConfig t = train(SampleMode::Packed);
    t.overlap_grad_reduce = overlap;
    Trainer tr(model(NormScheme::LNS, true), t, g_grid);
    for (int i = 0; i < 3; ++i) losses.push_back(tr.train_step().loss);
    tr.gather_master_weights();  // ZeRO on CUDA: the other shards' f32 master weights
    weights.push_back(to_host_f32(tr.model().params().flat_params()));
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(losses[i], losses[3 + i]) << "step " << i + 1;
  EXPECT_EQ(weights[0], weights[1]);
}

// ZeRO (each dp rank has its pieces of every bucket summed on it alone, updates only
// its shard and gathers the others') against the replicated update (every rank
// all-reduces and updates everything) on the same layout and batches: three steps'
// losses, gradient norms and every weight. With two dp ranks a sum has one
// association, so the two are equal bit for bit; with more, a reduce to rank r may
// associate differently from the all-reduce's reduce to rank 0: within kTol. The CPU
// step times of the two are printed, not asserted.
TEST(Zero, ShardedUpdateEqualsReplicatedUpdate) {
  const ::lns::Layout& lay = g_grid->layout;
  if (lay.dp == 1) GTEST_SKIP() << "needs dp > 1";
  std::vector<std::vector<float>> weights;
  std::vector<StepStats> stats;
  double seconds[2] = {};
  for (bool zero : {true, false}) {
    TrainConfig t = train(SampleMode::Packed);
    t.zero = zero;
    Trainer tr(model(NormScheme::LNS, true), t, g_grid);
    ASSERT_EQ(lay.zero, zero);
    const int64_t n = tr.model().params().numel();
    const ShardRange mine = lay.zero_shard(n, g_grid->coords.dp);
    EXPECT_EQ(tr.optimizer().end() - tr.optimizer().begin(), zero ? std::min(mine.end(), n) - std::min(mine.begin, n) : n);
    for (int i = 0; i < 3; ++i) {
      stats.push_back(tr.train_step());
      if (i > 0) seconds[zero ? 0 : 1] += stats.back().seconds;  // the first step warms up
    }
    // The dp group's traffic: pieces reduced to their owners under ZeRO (at least one per
    // bucket, at most one more per shard boundary), no all-reduce of gradients.
    CommCounts dp;
    for (const auto& [g, c] : tr.last_step_comm())
      if (g == "dp") dp = c;
    const int64_t reduces = dp.calls[static_cast<int>(Collective::Reduce)];
    const int64_t buckets = (n + 1023) / 1024;  // --dp_bucket_mb=0.001: 262 floats, raised to 1024
    if (!zero) {
      EXPECT_EQ(reduces, 0);
    } else if (FLAGS_dp_bucket_mb < 0.005) {
      EXPECT_GE(reduces, buckets);
      EXPECT_LE(reduces, buckets + lay.dp - 1);
    } else {
      EXPECT_GE(reduces, lay.dp);
    }
    tr.gather_master_weights();  // ZeRO on CUDA: the other shards' f32 master weights
    weights.push_back(to_host_f32(tr.model().params().flat_params()));
  }
  const bool bitwise = lay.dp == 2;
  for (int i = 0; i < 3; ++i) {
    if (bitwise) {
      EXPECT_EQ(stats[i].loss, stats[3 + i].loss) << "step " << i + 1;
      EXPECT_EQ(stats[i].grad_norm, stats[3 + i].grad_norm) << "step " << i + 1;
    } else {
      EXPECT_NEAR(stats[i].loss, stats[3 + i].loss, kTol * stats[3 + i].loss) << "step " << i + 1;
      EXPECT_NEAR(stats[i].grad_norm, stats[3 + i].grad_norm, kTol * stats[3 + i].grad_norm) << "step " << i + 1;
    }
  }
  ASSERT_EQ(weights[0].size(), weights[1].size());
  if (bitwise) {
    EXPECT_EQ(weights[0], weights[1]);
  } else {
    double err = 0, scale = 1e-30;
    for (size_t i = 0; i < weights[0].size(); ++i)
      err = std::max(err, std::abs(double(weights[0][i]) - weights[1][i])), scale = std::max(scale, std::abs(double(weights[1][i])));
    EXPECT_LE(err / scale, kTol);
  }
  if (g_grid->rank == 0)
    std::printf("[ zero ] %s on %s: step time, sharded %.2f ms vs replicated %.2f ms (steps 2-3; printed, not "
                "asserted%s)\n",
                lay.brief().c_str(), device_name(g_device), 1e3 * seconds[0] / 2, 1e3 * seconds[1] / 2,
                g_device == Device::CUDA ? "; emulated or shared GPU: not a speed" : "");
}

// Evaluation under a layout: perplexity, every entry of the layer-removal sweep and
// the depth diagnostics equal the single-rank values.
TEST(Eval, SweepAndDiagnosticsEqualSingleRank) {
  TrainConfig t = train(SampleMode::Packed);
  t.val_data = g_corpus;
  t.eval_tokens = 90;  // uneven over dp ranks and micro-batches
  std::vector<int> all(FLAGS_test_layers);
  for (int l = 0; l < FLAGS_test_layers; ++l) all[l] = l;
  Trainer par(model(NormScheme::Mix, false), t, g_grid);
  par.train_step();
  const auto got = par.evaluator()->sweep(all);
  const auto got_diag = par.evaluator()->diagnostics(0);
  if (g_grid->rank != 0) return;
  Trainer one(model(NormScheme::Mix, false), one_rank(t));
  one.train_step();
  const auto want = one.evaluator()->sweep(all);
  const auto want_diag = one.evaluator()->diagnostics(0);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, 90);
    EXPECT_NEAR(got[i].loss, want[i].loss, kTol * want[i].loss) << "sweep entry " << i;
  }
  for (size_t l = 0; l < want_diag.size(); ++l) {
    EXPECT_NEAR(got_diag[l].variance, want_diag[l].variance, kTol * want_diag[l].variance) << l;
    EXPECT_NEAR(got_diag[l].angular, want_diag[l].angular, kTol) << l;
    EXPECT_NEAR(got_diag[l].angular_last, want_diag[l].angular_last, kTol) << l;
  }
}

// --init_from under a layout: every rank loads its slice of the logical tensors (the
// golden file's FFN 45 and vocabulary 53 pad under tp = 2) and the step equals the
// single-rank step from the same file.
TEST(InitFrom, ShardedLoadEqualsSingleRank) {
  const std::string golden = std::string(LNS_SOURCE_DIR) + "/tests/golden/rmsnorm_mix.safetensors";
  LlamaConfig c;
  c.vocab_size = 53, c.hidden_size = 36, c.intermediate_size = 45, c.num_layers = 3;
  c.num_heads = 6, c.num_kv_heads = 2, c.norm_scheme = NormScheme::Mix, c.post_layers = 1;
  if (c.num_kv_heads % g_grid->layout.tp != 0 || c.num_layers < g_grid->layout.pp * FLAGS_virtual_stages)
    GTEST_SKIP() << "layout does not fit";
  TrainConfig t = train(SampleMode::Packed);
  t.init_from = golden;
  const std::string dir = ::testing::TempDir() + "/lns_mpi_init_" + std::to_string(::getppid());
  Trainer(c, t, g_grid).dump_step_state(dir + "_layout.safetensors");
  if (g_grid->rank != 0) return;
  compare_to_single_rank(dir + "_layout.safetensors", c, t);
}

// Padding rows of the FFN and the vocabulary start at zero, have zero gradients and
// stay exactly zero through optimizer steps (with weight decay and clipping).
TEST(Padding, StaysExactlyZero) {
  Trainer t(model(NormScheme::LNS, true), train(SampleMode::Packed), g_grid);
  for (int i = 0; i < 5; ++i) t.train_step();
  ParamSet& ps = t.model().params();
  ps.download();
  int64_t padded = 0;
  for (int i = 0; i < ps.size(); ++i) {
    const ParamInfo& p = ps.info(i);
    if (p.replicated()) continue;
    const Tensor w = ps.host_param(i);
    const int64_t cols = p.shape[1];
    for (int64_t j = 0; j < w.numel(); ++j) {
      int64_t li, lj;
      if (p.to_logical(j / cols, j % cols, &li, &lj)) continue;
      ++padded;
      ASSERT_EQ(w.f32()[j], 0.0f) << p.name << " padding element " << j;
    }
  }
  // tp = 2: rank 1 holds one padding row of the vocabulary (53 = 27 + 26) and of the
  // FFN (45 = 23 + 22) in each of gate, up (rows) and down (columns).
  if (g_grid->layout.tp == 2 && g_grid->coords.tp == 1) {
    EXPECT_GT(padded, 0);
  }
}

// A routed block's gate reads whole sequences: refused with sequence parallelism, on
// every rank, naming both.
TEST(SequenceParallel, RefusesRoutedBlocks) {
  if (!FLAGS_sequence_parallel || g_grid->layout.tp == 1) GTEST_SKIP() << "needs --sequence_parallel and --tp > 1";
  try {
    Trainer(model(NormScheme::Mono, false), train(SampleMode::Packed), g_grid);
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--sequence_parallel does not run routed blocks (--norm_scheme=routed"),
              std::string::npos)
        << e.what();
  }
}

// The byte counter against the communication of the model counted by hand, for this
// rank's stage: per micro-batch of N tokens (C = 32, tp group of p, f = (p-1)/p)
//  - plain tp: all-reduces of [N,C] after the embedding, after o_proj and down_proj
//    (2 per layer) and of the input gradients of q/k/v, gate/up (2 per layer) and of
//    the head; 3 all-reduces of [N] in the loss. Each all-reduce sends 2f of its bytes.
//  - sequence parallel: per sublayer an all-gather and a reduce-scatter forward, and
//    in backward an all-gather of the output gradient, the input gathered again and a
//    reduce-scatter (f each); reduce-scatter after the embedding, all-gather before the
//    head (forward and backward), reduce-scatter of its input gradient, all-gather of
//    the embedding's output gradient; the same loss all-reduces; once per step an
//    all-reduce of the replicated parameters' gradients.
//  - pipeline: each micro-batch's activations forward and gradients back, [N,C] or
//    this rank's [N/p,C] under sequence parallelism; per model chunk under the
//    interleaved pipeline, all but the model's first chunk receiving (and sending back)
//    and all but its last sending forward.
// The measured values are printed for docs/parallelism.md.
TEST(CommCounter, StepBytesMatchTheModelCountedByHand) {
  TrainConfig t = train(SampleMode::Packed);
  Trainer tr(model(NormScheme::LNS, false), t, g_grid);
  tr.train_step();
  const auto comm = tr.last_step_comm();
  auto group = [&](const std::string& name) {
    for (const auto& [g, c] : comm)
      if (g == name) return c;
    ADD_FAILURE() << name;
    return CommCounts{};
  };
  const ::lns::Layout& lay = g_grid->layout;
  const int p = lay.tp;
  // Activations in the stage's dtype (f32 on the CPU, bf16 on CUDA); loss statistics
  // and gradients f32.
  const double f = double(p - 1) / p, N = double(t.micro_batch * t.seq_len), C = 32,
               act = N * C * double(dtype_size(tr.model().activation_dtype()));
  const double M = tr.micro_batches();
  double L = 0;  // this rank's layers, over its model chunks
  for (const auto& [first, last] : lay.stage_chunks(g_grid->coords.pp)) L += last - first;
  const double V = lay.virtual_stages;
  const bool emb = g_grid->first_stage(), head = g_grid->last_stage();
  double want_tp = 0;
  if (p > 1) {
    double per_micro = head ? 3 * 2 * f * N * 4 : 0;  // the loss
    if (!lay.sequence_parallel_on()) {
      per_micro += 2 * f * act * (4 * L + (emb ? 1 : 0) + (head ? 1 : 0));
    } else {
      per_micro += f * act * (10 * L + (emb ? 2 : 0) + (head ? 3 : 0));
    }
    want_tp = M * per_micro;
    if (lay.sequence_parallel_on()) {
      double replicated = 0;
      for (const ParamInfo& i : tr.model().params().infos())
        if (i.replicated()) replicated += double(i.shape.numel());
      want_tp += 2 * f * replicated * 4;
    }
  }
  const CommCounts tpc = group("tp");
  EXPECT_NEAR(tpc.total_bytes(), want_tp, 1e-9 * want_tp);
  const double hidden = lay.sequence_parallel_on() ? act / p : act;
  const double want_pp = M * hidden * (2 * V - (head ? 1 : 0) - (emb ? 1 : 0));
  EXPECT_DOUBLE_EQ(group("pp").total_bytes(), want_pp);
  auto kind = [&](const CommCounts& c, Collective k) { return c.bytes[static_cast<int>(k)]; };
  // ZeRO on the CPU: every element of the flat gradient buffer in exactly one reduce
  // piece, and the f32 weights gathered in dp shards of ceil(numel / dp).
  const CommCounts dpc = group("dp");
  if (lay.dp > 1 && lay.zero && g_device == Device::CPU) {
    const double D = lay.dp, n = double(tr.model().params().numel()), fd = (D - 1) / D;
    EXPECT_DOUBLE_EQ(kind(dpc, Collective::Reduce), fd * n * 4);
    EXPECT_DOUBLE_EQ(kind(dpc, Collective::AllGather), fd * std::ceil(n / D) * D * 4);
    EXPECT_EQ(dpc.calls[static_cast<int>(Collective::ReduceScatter)], 0);
  }
  std::printf("[ comm ] %s rank %d: tp all_reduce %.0f all_gather %.0f reduce_scatter %.0f | pp send %.0f | dp %.0f | "
              "world %.0f bytes per step\n",
              lay.brief().c_str(), g_grid->rank, kind(tpc, Collective::AllReduce), kind(tpc, Collective::AllGather),
              kind(tpc, Collective::ReduceScatter), want_pp, group("dp").total_bytes(), group("world").total_bytes());
}

// Communicator::reduce to each root of the world in turn, in place and started:
// the root holds what all_reduce gives (bit for bit with two ranks, where a sum has
// one association), the other ranks' buffers are unchanged.
TEST(Communicator, ReduceToEachRootEqualsAllReduceThere) {
  Communicator& w = g_grid->world();
  const int n = 77;
  std::vector<float> mine(n);
  for (int i = 0; i < n; ++i) mine[i] = std::sin(1.3 * i + 0.7 * w.rank()) * (1 + w.rank());
  std::vector<float> want = mine;
  w.all_reduce(Tensor{want.data(), DType::F32, Device::CPU, Shape{n}}, ReduceOp::Sum);
  for (int root = 0; root < w.size(); ++root)
    for (bool start : {false, true}) {
      std::vector<float> got = mine;
      const Tensor t{got.data(), DType::F32, Device::CPU, Shape{n}};
      if (start)
        w.reduce_start(t, root), w.all_reduce_wait();
      else
        w.reduce(t, root);
      if (w.rank() != root) {
        EXPECT_EQ(got, mine) << "root " << root;
        continue;
      }
      double err = 0;
      for (int i = 0; i < n; ++i) err = std::max(err, std::abs(double(got[i]) - want[i]));
      EXPECT_LE(err, 1e-6 * w.size()) << "root " << root;
      if (w.size() == 2) {
        EXPECT_EQ(got, want) << "root " << root;
      }
    }
}

}  // namespace
}  // namespace lns

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  MPI_Init(&argc, &argv);
  lns::g_device = lns::parse_device(FLAGS_device);
  if (lns::g_device == lns::Device::CUDA) {
    if (lns::cuda_device_count() == 0) {  // the same answer on every rank: no collective needed
      std::printf("[  SKIPPED ] %s\n", lns::cuda_unavailable_reason().c_str());
      MPI_Finalize();
      return 77;
    }
    // NCCL needs a GPU per rank (Open MPI tells how many ranks share this node).
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (lns::comm_flag() == lns::CommKind::Nccl && local && lns::cuda_device_count() < std::atoi(local)) {
      std::printf("[  SKIPPED ] --comm=nccl needs %s GPUs, %d visible\n", local, lns::cuda_device_count());
      MPI_Finalize();
      return 77;
    }
    lns::bind_local_gpu(lns::local_rank_from_env());
    lns::kTol = 3e-2;
  }
  auto grid = lns::ProcessGrid::create_mpi(lns::tp_flag(), lns::pp_flag());
  if (lns::g_device == lns::Device::CUDA) grid->use_device_communicators(lns::comm_flag());
  lns::g_grid = grid.get();
  lns::g_corpus = lns::write_corpus();
  const int failed = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  grid.reset();
  MPI_Finalize();
  return any;
}
