// Activation recomputation (lns/model/recompute.h) computes exactly what --recompute=none
// computes, for every scheme, and holds the memory its account (lns/model/activation_memory.h)
// predicts, measured by the host allocator's counter.
#include <array>
#include <cstring>

#include <absl/strings/str_cat.h>

#include "lns/model/activation_memory.h"
#include "lns/core/device.h"
#include "lns/model/stage.h"
#include "lns/train/trainer.h"
#include "test_util.h"

namespace lns {
namespace {

using namespace lns::test;

std::vector<float> copy_of(Tensor t) { return {t.f32(), t.f32() + t.numel()}; }

LlamaConfig tiny(NormScheme scheme, NormType type) {
  LlamaConfig c;
  c.vocab_size = 29, c.hidden_size = 36, c.intermediate_size = 45, c.num_layers = 4;
  c.num_heads = 6, c.num_kv_heads = 3, c.norm_scheme = scheme, c.post_layers = 2;
  c.norm_type = type, c.init_std = 0.2f, c.embed_init_std = 1.0f;
  if (scheme == NormScheme::Hybrid)  // learned residual scales, sandwich, post and pre blocks
    c.layer_schemes = "scale_res_pre_norm,sandwich,post,pre";
  return c;
}

struct Mode {
  RecomputeMode mode;
  int layers;
};

// Gradients, losses and logits of two micro-batches in flight (forward 0, forward 1,
// backward 0, backward 1, as the 1F1B schedule interleaves them, so the recompute
// workspace is shared between slots); on stage [first, last).
struct StepResult {
  std::vector<float> logits, grads;
  double loss[2] = {};
};

StepResult run(LlamaConfig cfg, Mode m, StageSpec spec) {
  cfg.recompute = m.mode, cfg.recompute_layers = m.layers;
  const int64_t B = 2, T = 5, N = B * T;
  LlamaStage st(cfg, spec, B, T, /*num_slots=*/2);
  st.init_weights(42);
  st.params().zero_grads();
  std::vector<int32_t> ids[2], targets[2];
  for (int k = 0; k < 2; ++k) {
    ids[k].resize(N), targets[k].resize(N);
    for (int64_t i = 0; i < N; ++i) {
      ids[k][i] = (7 * i + 3 + 11 * k) % cfg.vocab_size;
      targets[k][i] = i == 4 ? kIgnoreIndex : (5 * i + 1 + k) % cfg.vocab_size;
    }
  }
  StepResult r;
  auto input = [&](int k) { return view(ids[k], {B, T}); };
  st.forward(input(0), 0);
  r.loss[0] = st.loss(view(targets[0], {N}), 0);
  r.logits = copy_of(st.forward(input(1), 1));
  r.loss[1] = st.loss(view(targets[1], {N}), 1);
  st.backward({}, 0.1f, 0);
  st.backward({}, 0.1f, 1);
  r.grads = copy_of(st.params().flat_grads());
  return r;
}

class RecomputeSchemes : public ::testing::TestWithParam<std::tuple<NormScheme, NormType>> {};

TEST_P(RecomputeSchemes, EveryModeIsBitwiseTheStepOfNone) {
  const auto [scheme, type] = GetParam();
  const LlamaConfig cfg = tiny(scheme, type);
  const StepResult want = run(cfg, {RecomputeMode::None, 0}, StageSpec::whole(cfg));
  ASSERT_GT(want.loss[0], 0.0);
  for (Mode m : {Mode{RecomputeMode::Selective, 0}, Mode{RecomputeMode::Full, 0},
                 Mode{RecomputeMode::Full, 2}}) {
    const StepResult got = run(cfg, m, StageSpec::whole(cfg));
    const std::string what = std::string(recompute_mode_name(m.mode)) + " layers " + std::to_string(m.layers);
    for (int k = 0; k < 2; ++k) EXPECT_EQ(got.loss[k], want.loss[k]) << what;
    EXPECT_EQ(got.logits, want.logits) << what;
    EXPECT_EQ(got.grads, want.grads) << what;  // bitwise: the same kernels on the same inputs
  }
}

INSTANTIATE_TEST_SUITE_P(
    Schemes, RecomputeSchemes,
    ::testing::Values(std::tuple{NormScheme::Pre, NormType::RMSNorm},
                      std::tuple{NormScheme::LNS, NormType::RMSNorm},
                      std::tuple{NormScheme::LNS, NormType::LayerNorm},
                      std::tuple{NormScheme::Post, NormType::LayerNorm},
                      std::tuple{NormScheme::Mix, NormType::RMSNorm},
                      std::tuple{NormScheme::Sandwich, NormType::RMSNorm},
                      std::tuple{NormScheme::DeepNorm, NormType::LayerNorm},
                      std::tuple{NormScheme::ScaledInit, NormType::RMSNorm},
                      std::tuple{NormScheme::DeepPost, NormType::RMSNorm},
                      std::tuple{NormScheme::ScalePostPre, NormType::RMSNorm},
                      std::tuple{NormScheme::ScaleResPre, NormType::RMSNorm},
                      std::tuple{NormScheme::Hybrid, NormType::LayerNorm},
                      std::tuple{NormScheme::Routed, NormType::RMSNorm},  // two paths per block
                      std::tuple{NormScheme::Mono, NormType::RMSNorm},
                      std::tuple{NormScheme::MonoReverse, NormType::LayerNorm}));

// A middle stage (no embedding, no head): its input is a hidden state and its output
// the last layer's, both kept; recomputing must not disturb either.
TEST(Recompute, MiddleStageGradientsAreBitwiseNone) {
  for (NormScheme scheme : {NormScheme::LNS, NormScheme::Sandwich}) {
    LlamaConfig cfg = tiny(scheme, NormType::RMSNorm);
    const StageSpec spec{1, 3, false, false};
    const int64_t B = 2, T = 5, C = cfg.hidden_size;
    std::vector<float> in = randn(B * T * C, 3), dout = randn(B * T * C, 4);
    auto go = [&](RecomputeMode mode) {
      cfg.recompute = mode;
      LlamaStage st(cfg, spec, B, T);
      st.init_weights(42);
      st.params().zero_grads();
      std::vector<float> out = copy_of(st.forward(view(in, {B, T, C})));
      std::vector<float> din = copy_of(st.backward(view(dout, {B, T, C}), 1.0f));
      out.insert(out.end(), din.begin(), din.end());
      const auto g = copy_of(st.params().flat_grads());
      out.insert(out.end(), g.begin(), g.end());
      return out;
    };
    const auto want = go(RecomputeMode::None);
    EXPECT_EQ(go(RecomputeMode::Selective), want) << norm_scheme_name(scheme);
    EXPECT_EQ(go(RecomputeMode::Full), want) << norm_scheme_name(scheme);
  }
}

// Training steps (AdamW, clipping, two micro-batches accumulated) under each mode end
// with bitwise the weights of --recompute=none.
TEST(Recompute, TrainerStepsLeaveBitwiseTheSameWeights) {
  TrainConfig tc;
  tc.seq_len = 8, tc.micro_batch = 2, tc.global_batch = 4, tc.steps = 2, tc.lr = 1e-2;
  auto weights = [&](RecomputeMode mode) {
    LlamaConfig cfg = tiny(NormScheme::LNS, NormType::RMSNorm);
    cfg.recompute = mode;
    Trainer tr(cfg, tc);
    for (int i = 0; i < tc.steps; ++i) tr.train_step();
    return copy_of(tr.model().params().flat_params());
  };
  const auto want = weights(RecomputeMode::None);
  EXPECT_EQ(weights(RecomputeMode::Selective), want);
  EXPECT_EQ(weights(RecomputeMode::Full), want);
}

// The stage's activations, measured by the host allocator: bytes held after building
// it, less its parameters and gradients (a ParamSet of the same layout, built alone)
// and its RoPE tables.
// tp: the tensor-parallel rank's shard (no communicator: building a stage sends nothing).
int64_t measured_activation_bytes(const LlamaConfig& cfg, StageSpec spec, int64_t B, int64_t T,
                                  const std::vector<int>& slots, TensorParallel tp = {}) {
  int64_t params = 0;
  {
    const size_t before = host_allocated_bytes();
    ParamSet p = LlamaStage::stage_params(cfg, spec, tp);
    p.finalize(Device::CPU);
    params = static_cast<int64_t>(host_allocated_bytes() - before);
  }
  const size_t before = host_allocated_bytes();
  LlamaStage st(cfg, spec, B, T, slots, tp, Device::CPU);
  const int64_t rope = 2 * ((T * cfg.head_dim() / 2 * 4 + 63) / 64 * 64);
  return static_cast<int64_t>(host_allocated_bytes() - before) - params - rope;
}

// With B*T = 16 every activation buffer ([N, *] and [B,H,T,T] f32) is a multiple of
// the allocator's 64-byte granule, so the account must match to the byte; except a
// routed block's five [B,2] f32 gate buffers, 16 bytes each, held as 64.
TEST(ActivationAccount, EveryModeHoldsWhatTheAccountPredicts) {
  for (NormScheme scheme : {NormScheme::LNS, NormScheme::Post, NormScheme::Sandwich, NormScheme::Hybrid,
                            NormScheme::Routed, NormScheme::Mono})
    for (NormType type : {NormType::RMSNorm, NormType::LayerNorm})
      for (Mode m : {Mode{RecomputeMode::None, 0}, Mode{RecomputeMode::Selective, 0},
                     Mode{RecomputeMode::Full, 0}, Mode{RecomputeMode::Full, 2}})
        for (StageSpec spec : {StageSpec{0, 4, true, true}, StageSpec{1, 3, false, false}}) {
          LlamaConfig cfg = tiny(scheme, type);
          cfg.recompute = m.mode, cfg.recompute_layers = m.layers;
          const ActivationAccount acc = activation_account(cfg, spec, 2, 8, 3, {}, Device::CPU);
          int64_t routed = 0;
          for (int g = spec.first_layer; g < spec.last_layer; ++g) routed += block_plan(cfg, g).route ? 1 : 0;
          const int64_t rounding = 3 * routed * 5 * (64 - 16);
          EXPECT_EQ(measured_activation_bytes(cfg, spec, 2, 8, {3}), acc.total() + rounding)
              << norm_scheme_name(scheme) << " " << norm_type_name(type) << " "
              << recompute_mode_name(m.mode) << " " << m.layers << " stage " << spec.first_layer;
        }
}

// Sequence parallelism: the split regions (norm inputs, outputs and statistics, residual
// stream, h0, the final norm) hold the rank's N / tp tokens, the tensor-parallel regions
// and the logits all N, and backward adds two full-token [N,C] buffers. Measured on the
// shards of tp = 2 and 3 (every rank's: the sequence split is even), for the non-routed
// schemes (routed blocks refuse --sequence_parallel). N = 96 puts every [N/tp] buffer on
// the 64-byte granule, so the account must match to the byte.
TEST(ActivationAccount, SequenceParallelHoldsWhatTheAccountPredicts) {
  const int64_t B = 4, T = 24, N = B * T, C = 36;
  for (NormScheme scheme : {NormScheme::LNS, NormScheme::Post, NormScheme::Sandwich, NormScheme::Mix})
    for (NormType type : {NormType::RMSNorm, NormType::LayerNorm})
      for (Mode m : {Mode{RecomputeMode::None, 0}, Mode{RecomputeMode::Selective, 0},
                     Mode{RecomputeMode::Full, 0}, Mode{RecomputeMode::Full, 2}})
        for (StageSpec spec : {StageSpec{0, 4, true, true}, StageSpec{1, 3, false, false}})
          for (int size : {2, 3})
            for (int rank = 0; rank < size; ++rank) {
              LlamaConfig cfg = tiny(scheme, type);
              cfg.num_kv_heads = 6;  // heads divisible by 2 and 3
              cfg.recompute = m.mode, cfg.recompute_layers = m.layers;
              const TensorParallel sp{rank, size, nullptr, true}, plain{rank, size, nullptr, false};
              const ActivationAccount acc = activation_account(cfg, spec, B, T, 3, sp, Device::CPU);
              const std::string what = absl::StrCat(norm_scheme_name(scheme), " ", norm_type_name(type), " ",
                                                    recompute_mode_name(m.mode), " ", m.layers, " stage ",
                                                    spec.first_layer, " tp ", rank, "/", size);
              EXPECT_EQ(measured_activation_bytes(cfg, spec, B, T, {3}, sp), acc.total()) << what;
              // What the split saves, by hand: h0 of each slot, and per layer every
              // split-region buffer a slot keeps (full: the output alone) shrink from
              // N to N / tp tokens; backward's six split gradients too, less the two
              // full-token buffers it adds.
              const ActivationAccount full = activation_account(cfg, spec, B, T, 3, plain, Device::CPU);
              const int64_t row = 4 * C * (N - N / size);  // one [N,C] f32 less its [N/tp,C]
              EXPECT_EQ(full.gradient_bytes - acc.gradient_bytes, 6 * row - 2 * 4 * N * C) << what;
              for (size_t i = 0; i < acc.layers.size(); ++i) {
                const int64_t saved = full.layers[i].kept_bytes - acc.layers[i].kept_bytes;
                if (acc.layers[i].mode == RecomputeMode::Full) {
                  EXPECT_EQ(saved, row) << what;  // its output alone
                } else {
                  EXPECT_GT(saved, 4 * row) << what;  // f and r of both sublayers, and more
                }
              }
            }
}

// --virtual_stages: a stage of two chunks (layers 0 and 2-3 of 4, the head after the
// second) with 3 and 2 slots; each slot binds only its chunk's layers, and full on the
// first 2 layers counts the stage's layers across chunks (layer 0 and layer 2).
TEST(ActivationAccount, InterleavedChunksHoldWhatTheAccountPredicts) {
  for (NormScheme scheme : {NormScheme::LNS, NormScheme::Hybrid})
    for (Mode m : {Mode{RecomputeMode::None, 0}, Mode{RecomputeMode::Selective, 0},
                   Mode{RecomputeMode::Full, 0}, Mode{RecomputeMode::Full, 2}}) {
      LlamaConfig cfg = tiny(scheme, NormType::LayerNorm);
      cfg.recompute = m.mode, cfg.recompute_layers = m.layers;
      StageSpec spec{0, 1, true, true};
      spec.chunks = {{0, 1}, {2, 4}};
      const ActivationAccount acc = activation_account(cfg, spec, 2, 8, std::vector<int>{3, 2}, {}, Device::CPU);
      ASSERT_EQ(acc.layers.size(), 3u);
      if (m.layers == 2) {
        EXPECT_EQ(acc.layers[2].mode, RecomputeMode::None);
      }
      const ActivationAccount one = activation_account(cfg, spec, 2, 8, 3, {}, Device::CPU);
      EXPECT_EQ(one.total() - acc.total(), acc.chunk_bytes[1]);  // the second chunk's third slot
      EXPECT_EQ(measured_activation_bytes(cfg, spec, 2, 8, {3, 2}), acc.total())
          << norm_scheme_name(scheme) << " " << recompute_mode_name(m.mode) << " " << m.layers;
    }
}

// Shapes that are not multiples of the granule: each buffer may round up by < 64 bytes.
TEST(ActivationAccount, WithinTheAllocatorSlackForOddShapes) {
  LlamaConfig cfg = tiny(NormScheme::LNS, NormType::LayerNorm);
  for (RecomputeMode mode : {RecomputeMode::None, RecomputeMode::Selective, RecomputeMode::Full}) {
    cfg.recompute = mode;
    const ActivationAccount acc = activation_account(cfg, StageSpec::whole(cfg), 1, 7, 2, {}, Device::CPU);
    const int64_t got = measured_activation_bytes(cfg, StageSpec::whole(cfg), 1, 7, {2});
    const int64_t buffers = 2 * (30 * cfg.num_layers + 12) + 60;  // generous count of buffers
    EXPECT_GE(got, acc.total());
    EXPECT_LT(got - acc.total(), 64 * buffers);
  }
}

// The account against the terms written out by hand for LNS with RMSNorm, f32:
// none keeps per layer u, f, r of both sublayers [N,C], q k v ctx, the [B,H,T,T]
// probabilities, gate up act [N,F] and two rstd [N]; selective drops ctx, the
// probabilities and act; full keeps the layer's output only.
TEST(ActivationAccount, MatchesTheTermsByHand) {
  LlamaConfig cfg = tiny(NormScheme::LNS, NormType::RMSNorm);
  const int64_t B = 2, T = 8, N = B * T, C = 36, F = 45, H = 6, QD = 36, KD = 18, V = 29;
  const int64_t none = 4 * N * (6 * C + 2 * QD + 2 * KD + 3 * F + 2) + 4 * B * H * T * T;
  const int64_t dropped = 4 * N * (QD + F) + 4 * B * H * T * T;
  const int64_t stage = 4 * N + 4 * N * C + 4 * N + 4 * N * C + 4 * N * V + 4 * N * 6;
  const int64_t grads = 4 * N * (6 * C + 2 * QD + 2 * KD + 3 * F);
  auto acc = [&](RecomputeMode m) {
    cfg.recompute = m;
    return activation_account(cfg, StageSpec::whole(cfg), B, T, 2, {}, Device::CPU);
  };
  const ActivationAccount a = acc(RecomputeMode::None), s = acc(RecomputeMode::Selective),
                          f = acc(RecomputeMode::Full);
  EXPECT_EQ(a.layers.at(0).kept_bytes, none);
  EXPECT_EQ(a.total(), 2 * (4 * none + stage) + grads);
  EXPECT_EQ(s.layers.at(3).kept_bytes, none - dropped);
  EXPECT_EQ(s.total(), 2 * (4 * (none - dropped) + stage) + dropped + grads);
  EXPECT_EQ(f.layers.at(2).kept_bytes, 4 * N * C);
  // The workspace of full: one layer's none less its output, which the slot keeps.
  EXPECT_EQ(f.total(), 2 * (4 * 4 * N * C + stage) + none - 4 * N * C + grads);
  EXPECT_NE(f.str().find("layers 0-3 full"), std::string::npos) << f.str();
}

// Nothing is allocated in forward or backward: the peak over a step is what the stage
// held once built.
TEST(ActivationAccount, AStepAllocatesNothing) {
  LlamaConfig cfg = tiny(NormScheme::LNS, NormType::RMSNorm);
  cfg.recompute = RecomputeMode::Full;
  LlamaStage st(cfg, StageSpec::whole(cfg), 2, 8);
  st.init_weights(1);
  std::vector<int32_t> ids(16, 3), targets(16, 5);
  reset_host_peak_allocated_bytes();
  const size_t held = host_allocated_bytes();
  st.forward(view(ids, {2, 8}));
  st.loss(view(targets, {16}));
  st.backward({}, 1.0f);
  EXPECT_EQ(host_peak_allocated_bytes(), held);
}

// LN-free calibration reads every sublayer's input after a forward; a full layer's
// second one lives in the shared workspace, so calibration refuses full (and works
// with selective, which keeps it).
TEST(Recompute, LnFreeCalibrationRefusesFull) {
  LlamaConfig cfg = tiny(NormScheme::LNS, NormType::RMSNorm);
  std::vector<int32_t> ids(10, 4);
  std::vector<std::array<double, 4>> sums;
  cfg.recompute = RecomputeMode::Selective;
  LlamaStage sel(cfg, StageSpec::whole(cfg), 2, 5);
  sel.init_weights(1);
  sel.forward(view(ids, {2, 5}));
  sel.add_divisor_sums(sums);
  EXPECT_GT(sums.at(1)[1], 0.0);  // the MLP pre-norm of layer 0 counted its tokens
  cfg.recompute = RecomputeMode::Full;
  LlamaStage full(cfg, StageSpec::whole(cfg), 2, 5);
  full.init_weights(1);
  full.forward(view(ids, {2, 5}));
  try {
    full.add_divisor_sums(sums);
    ADD_FAILURE() << "calibration under --recompute=full was not refused";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--recompute=none or selective"), std::string::npos) << e.what();
  }
}

TEST(Recompute, BadFlagsAreRefused) {
  EXPECT_THROW(parse_recompute_mode("partial"), UserError);
  LlamaConfig cfg = tiny(NormScheme::LNS, NormType::RMSNorm);
  cfg.recompute = RecomputeMode::Selective, cfg.recompute_layers = 2;
  EXPECT_THROW(cfg.validate(), UserError);  // --recompute_layers needs full
  cfg.recompute = RecomputeMode::Full, cfg.recompute_layers = 5;
  EXPECT_THROW(cfg.validate(), UserError);  // more than --num_layers
  cfg.recompute_layers = -1;
  EXPECT_THROW(cfg.validate(), UserError);
  EXPECT_EQ(layer_recompute(RecomputeMode::Full, 2, 1), RecomputeMode::Full);
  EXPECT_EQ(layer_recompute(RecomputeMode::Full, 2, 2), RecomputeMode::None);
  EXPECT_EQ(layer_recompute(RecomputeMode::Full, 0, 7), RecomputeMode::Full);
  EXPECT_EQ(layer_recompute(RecomputeMode::Selective, 0, 7), RecomputeMode::Selective);
}

}  // namespace
}  // namespace lns
