// Generation on CUDA (label `gpu`; runs under the emulation build, -DLNS_CUDA_SIM=ON, and
// skips without a GPU): the decode attention kernel against the CPU's on the same
// (bf16-rounded) inputs, every position's logits of the key/value-cache path against the
// CPU's forward() on the whole sequence, and greedy generation picking the CPU's tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <absl/strings/str_format.h>

#include "lns/core/bf16.h"
#include "lns/core/device.h"
#include "lns/model/generate.h"
#include "lns/core/ops.h"
#include "lns/model/stage.h"
#include "tests/common/generate_cases.h"
#include "tests/common/test_util.h"

namespace lns {
namespace {

#define REQUIRE_GPU()                                                                       \
  do {                                                                                      \
    if (cuda_device_count() == 0) GTEST_SKIP() << "skipped: " << cuda_unavailable_reason(); \
  } while (0)

// v rounded to bf16 (what the device holds), as f32.
std::vector<float> bf16_rounded(std::vector<float> v) {
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

OwnedTensor on_cuda(const std::vector<float>& v, Shape s) {
  std::vector<float> copy = v;
  OwnedTensor f32(DType::F32, s, Device::CUDA), b(DType::BF16, s, Device::CUDA);
  copy_tensor(f32, test::view(copy, s));
  cast(b, f32);
  return b;
}

TEST(GenerateCuda, DecodeAttentionEqualsTheCpu) {
  REQUIRE_GPU();
  const int64_t n = 3, Hq = 4, Hkv = 2, D = 16, Tmax = 20, pos = 9;  // queries at positions 9..11
  const std::vector<float> q = bf16_rounded(test::randn(n * Hq * D, 1)),
                           k = bf16_rounded(test::randn(Tmax * Hkv * D, 2)),
                           v = bf16_rounded(test::randn(Tmax * Hkv * D, 3));
  std::vector<float> qc = q, kc = k, vc = v, out(n * Hq * D), scores(n * Hq * Tmax);
  attention_decode(test::view(out, {n, Hq, D}), test::view(scores, {n, Hq, Tmax}), test::view(qc, {n, Hq, D}),
                   test::view(kc, {Tmax, Hkv, D}), test::view(vc, {Tmax, Hkv, D}), pos);
  OwnedTensor qd = on_cuda(q, {n, Hq, D}), kd = on_cuda(k, {Tmax, Hkv, D}), vd = on_cuda(v, {Tmax, Hkv, D});
  OwnedTensor od(DType::BF16, Shape{n, Hq, D}, Device::CUDA), sd(DType::F32, Shape{n, Hq, Tmax}, Device::CUDA);
  attention_decode(od, sd, qd, kd, vd, pos);
  const std::vector<float> got = to_host_f32(od);
  // bf16 output of f32 arithmetic: 2.2e-3 of the largest value measured under the emulator
  // (2026-11-29); bf16's half unit in the last place is 2e-3 to 4e-3.
  test::expect_close(got, out, 8e-3, "attention_decode CUDA vs CPU");
}

// The prompt in one pass, then one token at a time, on the device: every position's
// logits against the CPU's forward() on the whole sequence, within bf16's error.
class DecodeCuda : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(DecodeCuda, CacheEqualsTheCpuWholeSequence) {
  REQUIRE_GPU();
  const DecodeCase& c = GetParam();
  const LlamaConfig cfg = decode_config(c);
  const int64_t L = 12, P = 5, V = cfg.vocab_size;
  std::vector<int32_t> ids(L);
  for (int64_t t = 0; t < L; ++t) ids[t] = static_cast<int32_t>((t * 17 + 3) % V);
  ids[0] = 7, ids[8] = 7;
  LlamaStage whole(cfg, StageSpec::whole(cfg), 1, L);
  init_decode_weights(whole, c);
  const Tensor logits = whole.forward(test::view(ids, {1, L}));
  const std::vector<float> want(logits.f32(), logits.f32() + L * V);

  LlamaStage dev(cfg, StageSpec::whole(cfg), 1, 1, 1, {}, Device::CUDA);
  init_decode_weights(dev, c);
  dev.start_decode(L, 4);
  std::vector<float> got;
  dev.decode({ids.begin(), ids.begin() + P}, 0, &got);
  for (int64_t t = P; t < L; ++t) {
    const std::vector<float> r = dev.decode({ids[t]}, t);
    got.insert(got.end(), r.begin(), r.end());
  }
  double scale = 0;
  for (const float w : want) scale = std::max(scale, std::abs(double(w)));
  // bf16 weights and activations against f32: at most 1.3e-2 of the largest logit measured
  // under the emulator (2026-11-29, over these five cases).
  for (int64_t t = 0; t < L; ++t) {
    const double e = test::rel_max_err(got.data() + t * V, want.data() + t * V, V, scale);
    EXPECT_LE(e, 3e-2) << c.name << ": position " << t << " (relative to the largest logit " << scale << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Schemes, DecodeCuda,
                         ::testing::Values(DecodeCase{"lns", NormScheme::LNS},
                                           DecodeCase{"post_layernorm", NormScheme::Post, NormType::LayerNorm},
                                           DecodeCase{"sandwich", NormScheme::Sandwich},
                                           DecodeCase{"scale_res_pre_norm", NormScheme::ScaleResPre},
                                           DecodeCase{"ln_free", NormScheme::LNS, NormType::RMSNorm, false, "", true}),
                         [](const auto& info) { return info.param.name; });

// Greedy generation on the device picks the CPU's tokens, where the CPU's choice is
// clear of bf16's error (its top-2 logit gap, printed on a mismatch).
TEST(GenerateCuda, GreedyTokensEqualTheCpu) {
  REQUIRE_GPU();
  const DecodeCase c{"lns", NormScheme::LNS};
  const LlamaConfig cfg = decode_config(c);
  GenerateOptions opt;
  opt.max_new_tokens = 16;
  opt.sampling.temperature = 0;
  const std::vector<int32_t> prompt = {3, 14, 15, 9, 26};
  LlamaStage cpu(cfg, StageSpec::whole(cfg), 1, 1), dev(cfg, StageSpec::whole(cfg), 1, 1, 1, {}, Device::CUDA);
  init_decode_weights(cpu, c);
  init_decode_weights(dev, c);
  const std::vector<int32_t> want = generate(cpu, prompt, opt), got = generate(dev, prompt, opt);
  // The CPU's gaps along its own sequence, to explain a mismatch.
  std::vector<int32_t> seq = prompt;
  std::string gaps;
  cpu.start_decode(static_cast<int64_t>(prompt.size() + want.size()));
  std::vector<float> z = cpu.decode(seq, 0);
  for (size_t i = 0; i < want.size(); ++i) {
    std::vector<float> s = z;
    std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<float>());
    gaps += absl::StrFormat(" %.3f", s[0] - s[1]);
    if (i + 1 < want.size()) z = cpu.decode({want[i]}, static_cast<int64_t>(seq.size() + i));
  }
  EXPECT_EQ(got, want) << "CPU top-2 logit gaps per step:" << gaps;
}

}  // namespace
}  // namespace lns
