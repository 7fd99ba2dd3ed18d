// Activation recomputation on the CUDA path (label `gpu`; runs under the emulation build,
// -DLNS_CUDA_SIM=ON, and skips without a GPU): every mode gives the bits of
// --recompute=none on the device (the same kernels re-run on the same inputs), and the
// device bytes the stage holds are its parameters plus the activation account.
#include <gtest/gtest.h>

#include <cstring>

#include "lns/model/activation_memory.h"
#include "lns/core/device.h"
#include "lns/model/stage.h"
#include "tests/common/test_util.h"

namespace lns {
namespace {

#define REQUIRE_GPU()                                                               \
  do {                                                                              \
    if (cuda_device_count() == 0) GTEST_SKIP() << "skipped: " << cuda_unavailable_reason(); \
  } while (0)

Tensor host(std::vector<int32_t>& v, Shape s) {
  Tensor t;
  t.data = v.data(), t.dtype = DType::I32, t.shape = s;
  return t;
}

struct Result {
  std::vector<double> losses;
  std::vector<float> grads;
};

// Two micro-batches in flight (forward 0, forward 1, backward 0, backward 1), as 1F1B
// interleaves them: the recompute workspace is shared between the slots.
Result step(LlamaConfig c, RecomputeMode mode, int64_t B, int64_t T) {
  c.recompute = mode;
  LlamaStage s(c, StageSpec::whole(c), B, T, 2, {}, Device::CUDA);
  s.init_weights(11);
  std::vector<int32_t> ids[2], tg[2];
  Result r;
  for (int k = 0; k < 2; ++k) {
    ids[k].resize(B * T), tg[k].resize(B * T);
    for (int64_t i = 0; i < B * T; ++i)
      ids[k][i] = int32_t((i * 17 + 3 + 5 * k) % c.vocab_size), tg[k][i] = int32_t((i * 5 + 1 + k) % c.vocab_size);
    s.forward(host(ids[k], {B, T}), k);
    r.losses.push_back(s.loss(host(tg[k], {B * T}), k));
  }
  for (int k = 0; k < 2; ++k) s.backward({}, 1.0f / (B * T), k);
  r.grads = to_host_f32(s.params().flat_grads());
  return r;
}

class RecomputeCuda : public ::testing::TestWithParam<NormScheme> {};

TEST_P(RecomputeCuda, EveryModeIsBitwiseNoneOnTheDevice) {
  REQUIRE_GPU();
  LlamaConfig c = test::small_model(GetParam());
  c.hidden_size = 64, c.num_heads = 4, c.num_kv_heads = 2;  // head dim 16: materialized attention
  c.num_layers = 4;  // hybrid: lns, scale_res_pre_norm, deeppost (post-LN), sandwich
  const Result want = step(c, RecomputeMode::None, 2, 8);
  for (RecomputeMode m : {RecomputeMode::Selective, RecomputeMode::Full}) {
    const Result got = step(c, m, 2, 8);
    EXPECT_EQ(got.losses, want.losses) << recompute_mode_name(m);
    ASSERT_EQ(got.grads.size(), want.grads.size());
    EXPECT_EQ(0, std::memcmp(got.grads.data(), want.grads.data(), 4 * want.grads.size()))
        << recompute_mode_name(m);
  }
}

INSTANTIATE_TEST_SUITE_P(Schemes, RecomputeCuda,
                         ::testing::Values(NormScheme::LNS, NormScheme::Hybrid),
                         [](const auto& info) { return std::string(norm_scheme_name(info.param)); });

// The fused attention (head dim 64) saves only the log-sum-exp; selective re-runs it.
TEST(RecomputeCuda, FusedAttentionSelectiveIsBitwiseNone) {
  REQUIRE_GPU();
  LlamaConfig c = test::small_model(NormScheme::LNS);
  c.hidden_size = 128, c.num_heads = 2, c.num_kv_heads = 1, c.num_layers = 2;
  c.attention = AttentionImpl::Fused;
  const Result want = step(c, RecomputeMode::None, 1, 16), got = step(c, RecomputeMode::Selective, 1, 16);
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(0, std::memcmp(got.grads.data(), want.grads.data(), 4 * want.grads.size()));
}

// Device bytes held by a stage = its parameter buffers (f32, f32 gradients, bf16 copy)
// + RoPE tables + the account, to the byte (device Buffers are not rounded); on one
// rank, and on tp rank 1 of 2 with --sequence_parallel (split regions at N/2 tokens,
// bf16, shards padded to the GEMM alignment; no communicator: building sends nothing).
TEST(RecomputeCuda, DeviceBytesAreTheAccount) {
  REQUIRE_GPU();
  for (const TensorParallel tp : {TensorParallel{}, TensorParallel{1, 2, nullptr, true}}) {
    for (RecomputeMode m : {RecomputeMode::None, RecomputeMode::Selective, RecomputeMode::Full}) {
      LlamaConfig c = test::small_model(NormScheme::Sandwich);
      c.recompute = m;
      const int64_t B = 2, T = 8;
      const size_t before = cuda_allocated_bytes();
      LlamaStage s(c, StageSpec::whole(c), B, T, 3, tp, Device::CUDA);
      // the flat buffers as the device stores them (GEMM dims padded): f32 weights and
      // gradients and the bf16 compute copy, each with kSlack zero elements for the
      // in-place ZeRO all-gathers
      const int64_t params = (s.params().numel() + ParamSet::kSlack) * (4 + 4 + 2);
      const int64_t held = static_cast<int64_t>(cuda_allocated_bytes() - before) - params;
      const int64_t rope = 2 * T * (c.head_dim() / 2) * 4;
      const ActivationAccount acc = activation_account(c, StageSpec::whole(c), B, T, 3, tp, Device::CUDA);
      EXPECT_EQ(held - rope, acc.total()) << recompute_mode_name(m) << " tp " << tp.size;
    }
  }
}

}  // namespace
}  // namespace lns
