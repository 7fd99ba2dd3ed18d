// The CUDA backend against the CPU backend (label `gpu`; every test skips with the
// reason when this build has no CUDA or the machine no GPU).
//
// Each kernel runs on fresh random inputs rounded to bf16; the CPU op runs on the
// same rounded values in f32, so the only differences are the GPU's bf16 storage of
// outputs and intermediates and its f32 (instead of double) statistics.
// Tolerances, relative to each tensor's largest entry (test_util.h rel_max_err):
//   kOut  = 1e-2 for bf16 outputs of one op (a bf16 ulp is 2^-8 = 3.9e-3 relative);
//   kAttn = 2e-2 for attention (probabilities and dS are rounded to bf16 inside);
//   kF32  = 1e-4 for f32 outputs (statistics, parameter gradients) of bf16 inputs.
// Whole model steps compare the relative L2 error of every gradient (kStep).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <tuple>

#include "lns/core/bf16.h"
#include "lns/checkpoint/checkpoint.h"
#include "lns/optim/optim.h"
#include "lns/core/device.h"
#include "lns/core/op_profile.h"
#include "lns/core/fp8_linear.h"
#include "lns/model/fp8_state.h"
#include "lns/core/ops.h"
#include "lns/model/stage.h"
#include "tests/common/fp8_sharing.h"
#include "tests/common/test_util.h"

#ifdef LNS_WITH_CUDA
#include "src/cuda/gemm.h"
#include "src/cuda/runtime.h"
#endif

namespace lns {
namespace {

using test::randn;
using test::rel_max_err;

constexpr double kOut = 1e-2, kAttn = 2e-2, kF32 = 1e-4, kStep = 5e-2;

#define REQUIRE_GPU()                                                               \
  do {                                                                              \
    if (cuda_device_count() == 0) GTEST_SKIP() << "skipped: " << cuda_unavailable_reason(); \
  } while (0)

std::vector<float> round_bf16(std::vector<float> v) {
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

// A device tensor holding `host` (rounded to bf16 first when dtype is BF16). With
// misalign, the tensor starts one element into its allocation, so 16-byte vector
// paths cannot be taken.
struct Dev {
  std::vector<float> host;  // the values the GPU holds, as f32
  OwnedTensor storage;
  Tensor t;
  Dev(std::vector<float> v, Shape s, DType dt = DType::BF16, bool misalign = false) {
    host = dt == DType::BF16 ? round_bf16(std::move(v)) : std::move(v);
    const int64_t off = misalign ? 1 : 0;
    storage = OwnedTensor(dt, Shape{s.numel() + off}, Device::CUDA);
    t = storage.t.rows(off, off + s.numel()).view(s);
    if (dt == DType::BF16) {
      std::vector<uint16_t> b(host.size());
      for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(host[i]);
      copy_tensor(t, Tensor{b.data(), DType::BF16, Device::CPU, s});
    } else {
      copy_tensor(t, Tensor{host.data(), DType::F32, Device::CPU, s});
    }
  }
  operator Tensor() const { return t; }  // NOLINT
  std::vector<float> get() const { return to_host_f32(t); }
};

Dev zeros(Shape s, DType dt = DType::BF16, bool misalign = false) {
  return Dev(std::vector<float>(s.numel(), 0.0f), s, dt, misalign);
}

Tensor cpu(std::vector<float>& v, Shape s) { return Tensor{v.data(), DType::F32, Device::CPU, s}; }
Tensor cpu(std::vector<int32_t>& v, Shape s) { return Tensor{v.data(), DType::I32, Device::CPU, s}; }

double rel(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  return rel_max_err(got.data(), want.data(), static_cast<int64_t>(want.size()));
}

// ---- norms ----------------------------------------------------------------------------

struct NormCase {
  NormType type;
  int64_t C;
  bool misalign;
};

void PrintTo(const NormCase& c, std::ostream* os) { *os << "C=" << c.C; }
class Norm : public ::testing::TestWithParam<NormCase> {};

TEST_P(Norm, ResidualForwardMatchesCpu) {
  REQUIRE_GPU();
  const auto [type, C, mis] = GetParam();
  const int64_t N = 37;
  const bool ln = type == NormType::LayerNorm;
  const float alpha = 1.3f, scale = 1.0f / std::sqrt(3.0f), eps = 1e-5f;
  Dev x(randn(N * C, 1, 1.0f, 0.3f), {N, C}, DType::BF16, mis), d(randn(N * C, 2), {N, C}, DType::BF16, mis);
  Dev g(randn(C, 3, 0.2f, 1.0f), {C}, DType::F32), b(randn(C, 4, 0.1f), {C}, DType::F32);
  Dev res = zeros({N, C}, DType::BF16, mis), out = zeros({N, C}, DType::BF16, mis);
  Dev mean = zeros({N}, DType::F32), rstd = zeros({N}, DType::F32);
  residual_norm_forward(type, res, out, ln ? Tensor(mean) : Tensor{}, rstd, x, d, alpha, g,
                        ln ? Tensor(b) : Tensor{}, scale, eps);
  // CPU on the residual as the GPU stored it (bf16), so the statistics see the same x.
  std::vector<float> r = res.get(), want(N * C), wm(N), wr(N), gh = g.host, bh = b.host;
  for (int64_t i = 0; i < N * C; ++i) EXPECT_NEAR(r[i], alpha * x.host[i] + d.host[i], 1e-2 * (1 + std::abs(r[i])));
  norm_forward(type, cpu(want, {N, C}), ln ? cpu(wm, {N}) : Tensor{}, cpu(wr, {N}), cpu(r, {N, C}),
               cpu(gh, {C}), ln ? cpu(bh, {C}) : Tensor{}, scale, eps);
  EXPECT_LE(rel(out.get(), want), kOut);
  EXPECT_LE(rel(rstd.get(), wr), kF32);
  if (ln) {
    EXPECT_LE(rel(mean.get(), wm), kF32);
  }
}

TEST_P(Norm, BackwardMatchesCpu) {
  REQUIRE_GPU();
  const auto [type, C, mis] = GetParam();
  // More than twice the backward's 512 blocks at C = 64 (aligned: the one-chunk kernel;
  // misaligned: the general one), so that blocks take up to three rows; 300 at the wider
  // rows, which take minutes under the emulator with ASan at 1100.
  const int64_t N = C <= 64 ? 1100 : 300;
  const bool ln = type == NormType::LayerNorm;
  const float scale = 0.5f, eps = 1e-5f;
  Dev x(randn(N * C, 5, 1.0f, 0.2f), {N, C}, DType::BF16, mis), dy(randn(N * C, 6), {N, C}, DType::BF16, mis);
  Dev dres(randn(N * C, 7), {N, C}, DType::BF16, mis);
  Dev g(randn(C, 8, 0.2f, 1.0f), {C}, DType::F32), b(randn(C, 9, 0.1f), {C}, DType::F32);
  // statistics from the CPU forward, given to both backwards
  std::vector<float> xh = x.host, gh = g.host, bh = b.host, y(N * C), m(N), r(N);
  norm_forward(type, cpu(y, {N, C}), ln ? cpu(m, {N}) : Tensor{}, cpu(r, {N}), cpu(xh, {N, C}), cpu(gh, {C}),
               ln ? cpu(bh, {C}) : Tensor{}, scale, eps);
  Dev mean(m, {N}, DType::F32), rstd(r, {N}, DType::F32);
  Dev dx = zeros({N, C}, DType::BF16, mis);
  std::vector<float> dg0 = randn(C, 10), db0 = randn(C, 11);  // gradients accumulate (+=)
  Dev dgain(dg0, {C}, DType::F32), dbias(db0, {C}, DType::F32);
  norm_backward(type, dx, dgain, ln ? Tensor(dbias) : Tensor{}, dres, dy, x, ln ? Tensor(mean) : Tensor{}, rstd, g,
                scale);
  std::vector<float> wdx(N * C), wdg = dg0, wdb = db0, dyh = dy.host, drh = dres.host;
  norm_backward(type, cpu(wdx, {N, C}), cpu(wdg, {C}), ln ? cpu(wdb, {C}) : Tensor{}, cpu(drh, {N, C}),
                cpu(dyh, {N, C}), cpu(xh, {N, C}), ln ? cpu(m, {N}) : Tensor{}, cpu(r, {N}), cpu(gh, {C}), scale);
  EXPECT_LE(rel(dx.get(), wdx), kOut);
  EXPECT_LE(rel(dgain.get(), wdg), kF32);
  if (ln) {
    EXPECT_LE(rel(dbias.get(), wdb), kF32);
  }
}

// Hidden sizes: vectorized (64, 2048), a tail (45), 5461/2 rounded up (a tp shard of
// the 1B FFN width, odd), and a misaligned start.
INSTANTIATE_TEST_SUITE_P(
    Cases, Norm,
    ::testing::Values(NormCase{NormType::RMSNorm, 64, false}, NormCase{NormType::RMSNorm, 45, false},
                      NormCase{NormType::RMSNorm, 2731, false}, NormCase{NormType::RMSNorm, 2048, true},
                      NormCase{NormType::RMSNorm, 2048, false}, NormCase{NormType::LayerNorm, 64, false},
                      NormCase{NormType::LayerNorm, 2731, false}, NormCase{NormType::LayerNorm, 64, true}),
    [](const auto& info) {
      return std::string(info.param.type == NormType::LayerNorm ? "layernorm" : "rmsnorm") + "_" +
             std::to_string(info.param.C) + (info.param.misalign ? "_misaligned" : "");
    });

// ---- fixed-divisor norms (LN-free fine-tuning, docs/ln_free.md) ---------------------------
// Forward, backward (no term through the constant divisor) and the calibration sums
// against the CPU ops, on T = 5 positions per sequence, x holding the micro-batch's rows
// from row0 = 3 on (a rank's share under --sequence_parallel: x's rows 2, 7, ... are at
// position 0) and end-of-text rows (token 7, read by the kernel on the device).
class NormFixed : public ::testing::TestWithParam<NormCase> {};
TEST_P(NormFixed, ForwardBackwardAndDivisorSumsMatchCpu) {
  REQUIRE_GPU();
  const auto [type, C, mis] = GetParam();
  const int64_t T = 5, N = 60 * T + 2, row0 = 3;  // more rows than the backward's blocks take at once
  const bool ln = type == NormType::LayerNorm;
  const float scale = 1.0f / std::sqrt(3.0f);
  const int32_t eot = 7;
  std::vector<int32_t> ids(N);
  for (int64_t n = 0; n < N; ++n) ids[n] = int32_t((n * 11 + 2) % 13);
  OwnedTensor ids_dev(DType::I32, {N}, Device::CUDA);
  copy_tensor(ids_dev, cpu(ids, {N}));
  const FixedDivisor d{0.7f, 1.9f, T, eot, ids_dev, row0}, d_host{0.7f, 1.9f, T, eot, cpu(ids, {N}), row0};
  Dev x(randn(N * C, 21, 1.5f, 0.2f), {N, C}, DType::BF16, mis), dy(randn(N * C, 22), {N, C}, DType::BF16, mis);
  Dev dres(randn(N * C, 23), {N, C}, DType::BF16, mis);
  Dev g(randn(C, 24, 0.2f, 1.0f), {C}, DType::F32), b(randn(C, 25, 0.1f), {C}, DType::F32);
  Dev out = zeros({N, C}, DType::BF16, mis), mean = zeros({N}, DType::F32), rstd = zeros({N}, DType::F32);
  norm_forward_fixed(type, out, ln ? Tensor(mean) : Tensor{}, rstd, x, g, ln ? Tensor(b) : Tensor{}, scale, d);
  std::vector<float> xh = x.host, gh = g.host, bh = b.host, want(N * C), wm(N), wr(N);
  norm_forward_fixed(type, cpu(want, {N, C}), ln ? cpu(wm, {N}) : Tensor{}, cpu(wr, {N}), cpu(xh, {N, C}),
                     cpu(gh, {C}), ln ? cpu(bh, {C}) : Tensor{}, scale, d_host);
  EXPECT_LE(rel(out.get(), want), kOut);
  EXPECT_EQ(rstd.get(), wr) << "1/d exactly, as on the CPU";
  int eot_rows = 0;  // end-of-text rows not at position 0: the case the ids decide
  for (int64_t n = 0; n < N; ++n) {
    const bool first = (n + row0) % T == 0 || ids[n] == eot;
    eot_rows += (n + row0) % T != 0 && ids[n] == eot;
    ASSERT_EQ(wr[n], first ? 1.0f / 0.7f : 1.0f / 1.9f) << "row " << n;
  }
  EXPECT_GT(eot_rows, 10);
  if (ln) {
    EXPECT_LE(rel(mean.get(), wm), kF32);
  }

  Dev dx = zeros({N, C}, DType::BF16, mis);
  std::vector<float> dg0 = randn(C, 26), db0 = randn(C, 27);
  Dev dgain(dg0, {C}, DType::F32), dbias(db0, {C}, DType::F32);
  Dev mcpu(wm, {N}, DType::F32), rcpu(wr, {N}, DType::F32);
  norm_backward_fixed(type, dx, dgain, ln ? Tensor(dbias) : Tensor{}, dres, dy, x, ln ? Tensor(mcpu) : Tensor{}, rcpu,
                      g, scale);
  std::vector<float> wdx(N * C), wdg = dg0, wdb = db0, dyh = dy.host, drh = dres.host;
  norm_backward_fixed(type, cpu(wdx, {N, C}), cpu(wdg, {C}), ln ? cpu(wdb, {C}) : Tensor{}, cpu(drh, {N, C}),
                      cpu(dyh, {N, C}), cpu(xh, {N, C}), ln ? cpu(wm, {N}) : Tensor{}, cpu(wr, {N}), cpu(gh, {C}),
                      scale);
  EXPECT_LE(rel(dx.get(), wdx), kOut);
  EXPECT_LE(rel(dgain.get(), wdg), kF32);
  if (ln) {
    EXPECT_LE(rel(dbias.get(), wdb), kF32);
  }
  // The live backward differs (it has the divisor term): the flag reaches the kernel.
  Dev dx_live = zeros({N, C}, DType::BF16, mis), dg_live(dg0, {C}, DType::F32), db_live(db0, {C}, DType::F32);
  norm_backward(type, dx_live, dg_live, ln ? Tensor(db_live) : Tensor{}, dres, dy, x, ln ? Tensor(mcpu) : Tensor{},
                rcpu, g, scale);
  EXPECT_GT(rel(dx_live.get(), wdx), 10 * kOut);

  double got[4] = {0, 0, 0, 0}, cpu_sums[4] = {0, 0, 0, 0};
  norm_divisor_sums(type, x, T, 1e-5f, got, row0);
  norm_divisor_sums(type, cpu(xh, {N, C}), T, 1e-5f, cpu_sums, row0);
  EXPECT_EQ(got[1], 60);  // x's rows 2, 7, ..., 297 (calibration: position 0 only, no eot)
  EXPECT_EQ(got[3], N - 60);
  EXPECT_EQ(got[1], cpu_sums[1]);
  EXPECT_EQ(got[3], cpu_sums[3]);
  EXPECT_NEAR(got[0], cpu_sums[0], 1e-9 * cpu_sums[0]);  // f64 on both, other summation order
  EXPECT_NEAR(got[2], cpu_sums[2], 1e-9 * cpu_sums[2]);
  double again[4] = {0, 0, 0, 0};
  norm_divisor_sums(type, x, T, 1e-5f, again, row0);
  EXPECT_EQ(again[0], got[0]) << "not deterministic";
}
INSTANTIATE_TEST_SUITE_P(
    Cases, NormFixed,
    ::testing::Values(NormCase{NormType::RMSNorm, 64, false}, NormCase{NormType::RMSNorm, 45, false},
                      NormCase{NormType::RMSNorm, 2048, true}, NormCase{NormType::LayerNorm, 64, false},
                      NormCase{NormType::LayerNorm, 45, true}),
    [](const auto& info) {
      return std::string(info.param.type == NormType::LayerNorm ? "layernorm" : "rmsnorm") + "_" +
             std::to_string(info.param.C) + (info.param.misalign ? "_misaligned" : "");
    });

TEST(Norm, BackwardIsBitwiseDeterministic) {
  REQUIRE_GPU();
  const int64_t N = 1000, C = 512;
  Dev x(randn(N * C, 12), {N, C}), dy(randn(N * C, 13), {N, C}), g(randn(C, 14, 0.1f, 1.0f), {C}, DType::F32);
  Dev rstd(std::vector<float>(N, 1.0f), {N}, DType::F32);
  std::vector<std::vector<float>> dgs, dxs;
  for (int run = 0; run < 2; ++run) {
    Dev dx = zeros({N, C}), dg = zeros({C}, DType::F32);
    norm_backward(NormType::RMSNorm, dx, dg, {}, {}, dy, x, {}, rstd, g, 1.0f);
    dgs.push_back(dg.get()), dxs.push_back(dx.get());
  }
  EXPECT_EQ(0, std::memcmp(dgs[0].data(), dgs[1].data(), C * 4));
  EXPECT_EQ(0, std::memcmp(dxs[0].data(), dxs[1].data(), N * C * 4));
}

// ---- linear, RoPE, SwiGLU, embedding --------------------------------------------------

TEST(Linear, ForwardAndBackwardMatchCpu) {
  REQUIRE_GPU();
  const int64_t N = 37, in = 45, out = 29;
  Dev x(randn(N * in, 20), {N, in}), w(randn(out * in, 21, 0.2f), {out, in}), dy(randn(N * out, 22), {N, out});
  Dev y = zeros({N, out}), dx(randn(N * in, 23), {N, in}), dw(randn(out * in, 24), {out, in}, DType::F32);
  linear_forward(y, x, w);
  std::vector<float> xh = x.host, wh = w.host, dyh = dy.host, wy(N * out), wdx = dx.host, wdw = dw.host;
  linear_forward(cpu(wy, {N, out}), cpu(xh, {N, in}), cpu(wh, {out, in}));
  EXPECT_LE(rel(y.get(), wy), kOut);
  linear_backward(dx, dw, dy, x, w, /*accumulate_dx=*/true);
  linear_backward(cpu(wdx, {N, in}), cpu(wdw, {out, in}), cpu(dyh, {N, out}), cpu(xh, {N, in}), cpu(wh, {out, in}),
                  true);
  EXPECT_LE(rel(dx.get(), wdx), kOut);
  EXPECT_LE(rel(dw.get(), wdw), kF32);
  // f32 output (the LM head's logits may be kept in f32)
  Dev yf = zeros({N, out}, DType::F32);
  linear_forward(yf, x, w);
  EXPECT_LE(rel(yf.get(), wy), kF32);
}

// D = 10: scalar path (D/2 = 5); D = 16: 16-byte vectors.
class Rope : public ::testing::TestWithParam<int64_t> {};
TEST_P(Rope, ForwardAndBackwardMatchCpu) {
  REQUIRE_GPU();
  const int64_t B = 2, T = 9, H = 3, D = GetParam();
  std::vector<float> cs(T * D / 2), sn(T * D / 2);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < D / 2; ++j) {
      const double a = t * std::pow(10000.0, -2.0 * j / D);
      cs[t * D / 2 + j] = float(std::cos(a)), sn[t * D / 2 + j] = float(std::sin(a));
    }
  Dev c(cs, {T, D / 2}, DType::F32), s(sn, {T, D / 2}, DType::F32);
  for (bool fwd : {true, false}) {
    Dev x(randn(B * T * H * D, 30), {B, T, H, D});
    std::vector<float> want = x.host;
    if (fwd) {
      rope_forward(x, c, s);
      rope_forward(cpu(want, {B, T, H, D}), cpu(cs, {T, D / 2}), cpu(sn, {T, D / 2}));
    } else {
      rope_backward(x, c, s);
      rope_backward(cpu(want, {B, T, H, D}), cpu(cs, {T, D / 2}), cpu(sn, {T, D / 2}));
    }
    EXPECT_LE(rel(x.get(), want), kOut) << (fwd ? "forward" : "backward");
  }
}
INSTANTIATE_TEST_SUITE_P(HeadDims, Rope, ::testing::Values(10, 16));

// 37 x 45: scalar path; 1024: 16-byte vectors.
class SwiGLU : public ::testing::TestWithParam<int64_t> {};
TEST_P(SwiGLU, ForwardAndBackwardMatchCpu) {
  REQUIRE_GPU();
  const int64_t n = GetParam();
  Dev g(randn(n, 40, 2.0f), {n}), u(randn(n, 41), {n}), dout(randn(n, 42), {n});
  Dev out = zeros({n}), dg = zeros({n}), du = zeros({n});
  swiglu_forward(out, g, u);
  swiglu_backward(dg, du, dout, g, u);
  std::vector<float> gh = g.host, uh = u.host, dh = dout.host, wo(n), wdg(n), wdu(n);
  swiglu_forward(cpu(wo, {n}), cpu(gh, {n}), cpu(uh, {n}));
  swiglu_backward(cpu(wdg, {n}), cpu(wdu, {n}), cpu(dh, {n}), cpu(gh, {n}), cpu(uh, {n}));
  EXPECT_LE(rel(out.get(), wo), kOut);
  EXPECT_LE(rel(dg.get(), wdg), kOut);
  EXPECT_LE(rel(du.get(), wdu), kOut);
}
INSTANTIATE_TEST_SUITE_P(Sizes, SwiGLU, ::testing::Values(37 * 45, 1024));

// A learned scalar on one addend: r = a*x + f, then dalpha += sum(dr*x) (fixed-grid f64
// partial sums: deterministic) and dx = a*dr, in place and, as scale_res_pre_norm's block
// calls it (x its sublayer's output F), into another buffer with dr left as it was.
TEST(ScaledResidual, ForwardAndBackwardMatchCpuAndRepeat) {
  REQUIRE_GPU();
  const int64_t n = 37 * 45;
  Dev x(randn(n, 90), {n}), f(randn(n, 91), {n}), dr(randn(n, 92), {n}), r = zeros({n});
  Dev alpha(std::vector<float>{0.8f}, {1}, DType::F32), dalpha(std::vector<float>{0.5f}, {1}, DType::F32);
  scaled_residual_forward(r, x, f, alpha);
  scaled_residual_backward(dr, dalpha, dr, x, alpha);
  std::vector<float> xh = x.host, fh = f.host, drh = dr.host, wr(n), a = {0.8f}, da = {0.5f};
  scaled_residual_forward(cpu(wr, {n}), cpu(xh, {n}), cpu(fh, {n}), cpu(a, {1}));
  scaled_residual_backward(cpu(drh, {n}), cpu(da, {1}), cpu(drh, {n}), cpu(xh, {n}), cpu(a, {1}));
  EXPECT_LE(rel(r.get(), wr), kOut);
  EXPECT_LE(rel(dr.get(), drh), kOut);
  EXPECT_NEAR(dalpha.get()[0], da[0], kF32 * std::abs(da[0]));
  Dev dr2(dr.host, {n}), dalpha2(std::vector<float>{0.5f}, {1}, DType::F32);
  scaled_residual_backward(dr2, dalpha2, dr2, x, alpha);
  EXPECT_EQ(dalpha2.get(), dalpha.get()) << "not deterministic";
  Dev dr3(dr.host, {n}), dx3 = zeros({n}), dalpha3(std::vector<float>{0.5f}, {1}, DType::F32);
  scaled_residual_backward(dx3, dalpha3, dr3, x, alpha);
  EXPECT_EQ(dx3.get(), dr.get()) << "into another buffer: the same as in place";
  EXPECT_EQ(dalpha3.get(), dalpha.get());
  EXPECT_EQ(dr3.get(), dr.host) << "dr is read only when dx is another buffer";
}

// The routed block's gate and mix (mono, mono_reverse) on B = 3 sequences: the noise
// makes sequences 0 and 2 take path 0 and sequence 1 path 1 by a clear margin, so both
// devices pick the same gate; soft and every gradient against the CPU ops.
TEST(Route, GateAndMixMatchCpuAndRepeat) {
  REQUIRE_GPU();
  const int64_t B = 3, T = 5, C = 45, n = B * T * C;
  Dev x(randn(n, 93), {B, T, C}), w(randn(2 * C, 94, 0.2f), {2, C}, DType::F32);
  Dev noise(std::vector<float>{4.0f, -4.0f, -4.0f, 4.0f, 3.0f, -3.0f}, {B, 2}, DType::F32);
  Dev gate = zeros({B, 2}, DType::F32), soft = zeros({B, 2}, DType::F32);
  route_gate_forward(gate, soft, x, w, noise);
  std::vector<float> xh = x.host, wh = w.host, nh = noise.host, wg(2 * B), ws(2 * B);
  route_gate_forward(cpu(wg, {B, 2}), cpu(ws, {B, 2}), cpu(xh, {B, T, C}), cpu(wh, {2, C}), cpu(nh, {B, 2}));
  EXPECT_EQ(gate.get(), wg);
  EXPECT_EQ(wg, (std::vector<float>{1, 0, 0, 1, 1, 0}));
  EXPECT_LE(rel(soft.get(), ws), kF32);

  Dev p0(randn(n, 95), {B, T, C}), p1(randn(n, 96), {B, T, C}), dy(randn(n, 97), {B, T, C});
  Dev y = zeros({B, T, C}), dp0 = zeros({B, T, C}), dp1 = zeros({B, T, C}), dgate = zeros({B, 2}, DType::F32);
  route_mix_forward(y, p0, p1, gate);
  route_mix_backward(dp0, dp1, dgate, dy, p0, p1, gate);
  std::vector<float> p0h = p0.host, p1h = p1.host, dyh = dy.host, wy(n), wd0(n), wd1(n), wdg(2 * B);
  route_mix_forward(cpu(wy, {B, T, C}), cpu(p0h, {B, T, C}), cpu(p1h, {B, T, C}), cpu(wg, {B, 2}));
  route_mix_backward(cpu(wd0, {B, T, C}), cpu(wd1, {B, T, C}), cpu(wdg, {B, 2}), cpu(dyh, {B, T, C}),
                     cpu(p0h, {B, T, C}), cpu(p1h, {B, T, C}), cpu(wg, {B, 2}));
  EXPECT_LE(rel(y.get(), wy), kOut);
  EXPECT_LE(rel(dp0.get(), wd0), kOut);
  EXPECT_LE(rel(dp1.get(), wd1), kOut);
  EXPECT_LE(rel(dgate.get(), wdg), kF32);

  Dev dx(randn(n, 98), {B, T, C}), dw(randn(2 * C, 99), {2, C}, DType::F32);
  std::vector<float> dxh = dx.host, dwh = dw.host, dgh = dgate.get(), sh = soft.get();
  route_gate_backward(dx, dw, dgate, soft, x, w);
  route_gate_backward(cpu(dxh, {B, T, C}), cpu(dwh, {2, C}), cpu(dgh, {B, 2}), cpu(sh, {B, 2}), cpu(xh, {B, T, C}),
                      cpu(wh, {2, C}));
  EXPECT_LE(rel(dx.get(), dxh), kOut);
  EXPECT_LE(rel(dw.get(), dwh), kF32);

  Dev dgate2 = zeros({B, 2}, DType::F32), scratch0 = zeros({B, T, C}), scratch1 = zeros({B, T, C});
  route_mix_backward(scratch0, scratch1, dgate2, dy, p0, p1, gate);
  EXPECT_EQ(dgate2.get(), dgate.get()) << "not deterministic";
}

// axpby on bf16 (the residual adds): 1024 aligned takes the 16-byte path, 1024
// misaligned and 37 x 45 the scalar one; a = 0 must not read y (NaN there).
struct AxpbyCase {
  int64_t n;
  bool misalign;
  float a;
};
void PrintTo(const AxpbyCase& c, std::ostream* os) { *os << "n=" << c.n << " misalign=" << c.misalign << " a=" << c.a; }
class Axpby : public ::testing::TestWithParam<AxpbyCase> {};
TEST_P(Axpby, Bf16MatchesCpu) {
  REQUIRE_GPU();
  const AxpbyCase c = GetParam();
  std::vector<float> y0 = randn(c.n, 50);
  if (c.a == 0.0f) y0.assign(c.n, std::numeric_limits<float>::quiet_NaN());
  Dev y(y0, {c.n}, DType::BF16, c.misalign), x(randn(c.n, 51), {c.n}, DType::BF16, c.misalign);
  axpby(y, c.a, x, 0.75f);
  std::vector<float> want = y.host, xh = x.host;
  if (c.a == 0.0f) want.assign(c.n, 0.0f);  // the CPU op reads y; a = 0 means "ignore y"
  axpby(cpu(want, {c.n}), c.a, cpu(xh, {c.n}), 0.75f);
  EXPECT_LE(rel(y.get(), want), kOut);
}
INSTANTIATE_TEST_SUITE_P(Paths, Axpby,
                         ::testing::Values(AxpbyCase{1024, false, 1.5f}, AxpbyCase{1024, true, 1.5f},
                                           AxpbyCase{37 * 45, false, -0.5f}, AxpbyCase{1024, false, 0.0f}));

// C = 36: scalar copies; C = 64: 16-byte vectors.
class Embedding : public ::testing::TestWithParam<int64_t> {};
TEST_P(Embedding, VocabShardForwardBackwardMatchCpuAndRepeat) {
  REQUIRE_GPU();
  const int64_t N = 64, C = GetParam(), rows = 20, begin = 10;  // this rank holds ids 10..29
  std::vector<int32_t> ids(N);
  for (int64_t n = 0; n < N; ++n) ids[n] = int32_t((n * 7) % 40);  // repeats, other ranks' ids
  OwnedTensor dids(DType::I32, Shape{N}, Device::CUDA);
  copy_tensor(dids, cpu(ids, {N}));
  Dev w(randn(rows * C, 50), {rows, C}), dout(randn(N * C, 51), {N, C}), out = zeros({N, C});
  embedding_forward(out, dids, w, begin);
  std::vector<float> wh = w.host, dh = dout.host, want(N * C), wdw(rows * C, 0.0f);
  embedding_forward(cpu(want, {N, C}), cpu(ids, {N}), cpu(wh, {rows, C}), begin);
  EXPECT_EQ(rel(out.get(), want), 0.0);  // a copy: exact
  embedding_backward(cpu(wdw, {rows, C}), cpu(ids, {N}), cpu(dh, {N, C}), begin);
  std::vector<std::vector<float>> runs;
  for (int r = 0; r < 2; ++r) {
    Dev dw = zeros({rows, C}, DType::F32);
    embedding_backward(dw, dids, dout, begin);
    runs.push_back(dw.get());
  }
  EXPECT_LE(rel(runs[0], wdw), kF32);
  EXPECT_EQ(0, std::memcmp(runs[0].data(), runs[1].data(), rows * C * 4)) << "not deterministic";
}
// 36 scalar, 64 vector; 2056 (vector) and 2051 (scalar) take more than one pass of the
// backward's 256 threads over the columns.
INSTANTIATE_TEST_SUITE_P(Widths, Embedding, ::testing::Values(36, 64, 2056, 2051));

// The device-side order of the backward over several 256-token tiles (the last one
// partial): one row taking a third of the tokens, rows with one token, rows with none,
// and ids of other ranks on both sides of this rank's range.
TEST(Embedding, BackwardOverSeveralTilesMatchesCpu) {
  REQUIRE_GPU();
  const int64_t N = 700, C = 40, rows = 50, begin = 100;
  std::vector<int32_t> ids(N);
  for (int64_t n = 0; n < N; ++n)
    ids[n] = n % 3 == 0 ? int32_t(begin + 7) : int32_t((n * 37) % 260);  // 0..259: before, in, after
  OwnedTensor dids(DType::I32, Shape{N}, Device::CUDA);
  copy_tensor(dids, cpu(ids, {N}));
  Dev dout(randn(N * C, 52), {N, C}), dw = zeros({rows, C}, DType::F32);
  std::vector<float> dh = dout.host, want(rows * C, 0.0f);
  embedding_backward(dw, dids, dout, begin);
  embedding_backward(cpu(want, {rows, C}), cpu(ids, {N}), cpu(dh, {N, C}), begin);
  EXPECT_LE(rel(dw.get(), want), kF32);
}

// ---- attention --------------------------------------------------------------------------

struct AttnCase {
  int64_t B, T, Hq, Hkv, D;
};
void PrintTo(const AttnCase& c, std::ostream* os) { *os << "T=" << c.T; }
class Attention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(Attention, ForwardAndBackwardMatchCpu) {
  REQUIRE_GPU();
  const auto [B, T, Hq, Hkv, D] = GetParam();
  const Shape qs{B, T, Hq, D}, ks{B, T, Hkv, D};
  Dev q(randn(qs.numel(), 60), qs), k(randn(ks.numel(), 61), ks), v(randn(ks.numel(), 62), ks);
  Dev dout(randn(qs.numel(), 63), qs), out = zeros(qs);
  Dev saved = zeros(attention_saved_shape(Device::CUDA, B, T, Hq), DType::F32);
  Dev dq = zeros(qs), dk = zeros(ks), dv = zeros(ks);
  attention_forward(out, saved, q, k, v);
  attention_backward(dq, dk, dv, dout, saved, q, k, v);
  std::vector<float> qh = q.host, kh = k.host, vh = v.host, dh = dout.host, wo(qs.numel()),
                     probs(attention_saved_shape(Device::CPU, B, T, Hq).numel()), wdq(qs.numel()),
                     wdk(ks.numel()), wdv(ks.numel());
  const Shape ps = attention_saved_shape(Device::CPU, B, T, Hq);
  attention_forward(cpu(wo, qs), cpu(probs, ps), cpu(qh, qs), cpu(kh, ks), cpu(vh, ks));
  attention_backward(cpu(wdq, qs), cpu(wdk, ks), cpu(wdv, ks), cpu(dh, qs), cpu(probs, ps), cpu(qh, qs),
                     cpu(kh, ks), cpu(vh, ks));
  EXPECT_LE(rel(out.get(), wo), kAttn);
  EXPECT_LE(rel(dq.get(), wdq), kAttn);
  EXPECT_LE(rel(dk.get(), wdk), kAttn);
  EXPECT_LE(rel(dv.get(), wdv), kAttn);
}

// GQA with odd T; head dim 12 (scalar permutes); multi-head attention at the paper's
// T = 256; one long sequence (T = 2048) that the CPU can still check.
INSTANTIATE_TEST_SUITE_P(Shapes, Attention,
                         ::testing::Values(AttnCase{2, 17, 6, 2, 16}, AttnCase{1, 9, 4, 2, 12},
                                           AttnCase{2, 256, 4, 4, 64}, AttnCase{1, 2048, 2, 1, 64}),
                         [](const auto& info) {
                           const auto& p = info.param;
                           return "B" + std::to_string(p.B) + "_T" + std::to_string(p.T) + "_H" +
                                  std::to_string(p.Hq) + "_" + std::to_string(p.Hkv) + "_D" + std::to_string(p.D);
                         });

// ---- cross-entropy, optimizer ---------------------------------------------------------

// V = 50 (valid 45): scalar rows; V = 64 (valid 61): 16-byte vectors with a partial
// last vector of valid columns.
class CrossEntropy : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};
TEST_P(CrossEntropy, VocabShardPiecesMatchCpu) {
  REQUIRE_GPU();
  const auto [V, valid] = GetParam();
  const int64_t N = 23, begin = 10;  // padding columns valid..V-1
  std::vector<int32_t> tg(N);
  for (int64_t n = 0; n < N; ++n) tg[n] = n % 7 == 3 ? kIgnoreIndex : int32_t((n * 13) % 70);
  OwnedTensor dtg(DType::I32, Shape{N}, Device::CUDA);
  copy_tensor(dtg, cpu(tg, {N}));
  Dev logits(randn(N * V, 70, 3.0f), {N, V});
  Dev mx = zeros({N}, DType::F32), se = zeros({N}, DType::F32), tl = zeros({N}, DType::F32),
      loss = zeros({N}, DType::F32);
  vocab_max_sumexp_target(mx, se, tl, logits, dtg, begin, valid);
  vocab_sumexp_rescale(se, mx, mx);  // one rank: a factor of exactly 1
  cross_entropy_combine(loss, mx, se, tl, dtg);
  std::vector<float> lh = logits.host, wmx(N), wse(N), wtl(N), wl(N), wd(N * V);
  vocab_max_sumexp_target(cpu(wmx, {N}), cpu(wse, {N}), cpu(wtl, {N}), cpu(lh, {N, V}), cpu(tg, {N}), begin, valid);
  cross_entropy_combine(cpu(wl, {N}), cpu(wmx, {N}), cpu(wse, {N}), cpu(wtl, {N}), cpu(tg, {N}));
  EXPECT_LE(rel(mx.get(), wmx), kF32);
  EXPECT_LE(rel(se.get(), wse), 1e-3);  // __expf
  EXPECT_LE(rel(tl.get(), wtl), kF32);
  EXPECT_LE(rel(loss.get(), wl), 1e-3);
  vocab_cross_entropy_backward(logits, logits, mx, se, dtg, begin, valid, 0.25f);  // in place
  vocab_cross_entropy_backward(cpu(wd, {N, V}), cpu(lh, {N, V}), cpu(wmx, {N}), cpu(wse, {N}), cpu(tg, {N}), begin,
                               valid, 0.25f);
  EXPECT_LE(rel(logits.get(), wd), kOut);
}
// Each row's max and sum of exp(x - max) of x[N,V], in f64.
struct RowSums {
  std::vector<float> max, sumexp;
};
RowSums row_sums_f64(const std::vector<float>& x, int64_t N, int64_t V) {
  RowSums r{std::vector<float>(N), std::vector<float>(N)};
  for (int64_t n = 0; n < N; ++n) {
    double m = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, double(x[n * V + j]));
    for (int64_t j = 0; j < V; ++j) sum += std::exp(double(x[n * V + j]) - m);
    r.max[n] = float(m), r.sumexp[n] = float(sum);
  }
  return r;
}

// Two ranks' shards of each row (columns [0, 24) and [24, 61)): each rank's max and
// sum-exp in one pass, the sums rescaled to the max over both and added, as the stage does
// around its all-reduces, against the f64 sum of the whole row. Rows where one shard's
// max is far below the other's test the rescale (a factor near 0, not 1).
TEST(CrossEntropyShards, SumsRescaledToTheGlobalMaxAreTheRowsSum) {
  REQUIRE_GPU();
  const int64_t N = 19, V = 61, split = 24;
  std::vector<float> full = randn(N * V, 71, 2.0f);
  for (int64_t n = 0; n < N; n += 3)
    for (int64_t j = 0; j < split; ++j) full[n * V + j] -= 30.0f;  // shard 0 far below shard 1
  for (int64_t n = 1; n < N; n += 3)
    for (int64_t j = split; j < V; ++j) full[n * V + j] += 12.0f;
  full = round_bf16(full);
  std::vector<int32_t> tg(N, 0);
  OwnedTensor dtg(DType::I32, Shape{N}, Device::CUDA);
  copy_tensor(dtg, cpu(tg, {N}));
  std::vector<float> gmax(N, -INFINITY), total(N, 0.0f);
  std::vector<Dev> local, sums;
  const int64_t bounds[3] = {0, split, V};
  for (int r = 0; r < 2; ++r) {
    const int64_t w = bounds[r + 1] - bounds[r];
    std::vector<float> part(N * w);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < w; ++j) part[n * w + j] = full[n * V + bounds[r] + j];
    Dev logits(part, {N, w}), tl = zeros({N}, DType::F32);
    local.push_back(zeros({N}, DType::F32)), sums.push_back(zeros({N}, DType::F32));
    vocab_max_sumexp_target(local[r], sums[r], tl, logits, dtg, bounds[r], w);
    const std::vector<float> m = local[r].get();
    for (int64_t n = 0; n < N; ++n) gmax[n] = std::max(gmax[n], m[n]);
  }
  Dev g(gmax, {N}, DType::F32);
  for (int r = 0; r < 2; ++r) {
    vocab_sumexp_rescale(sums[r], local[r], g);
    const std::vector<float> sr = sums[r].get();
    for (int64_t n = 0; n < N; ++n) total[n] += sr[n];
  }
  const RowSums want = row_sums_f64(full, N, V);
  EXPECT_EQ(gmax, want.max);
  EXPECT_LE(rel(total, want.sumexp), 1e-5);
}

// Rows long enough that a thread of the one-pass kernel takes several vectors (V 9000,
// 16-byte vectors: 512 threads x 8 columns a pass) or several columns (V 1001, odd:
// scalar), rising along the row so that each later one raises the thread's max and its
// running sum must be rescaled, against the f64 sum.
TEST(CrossEntropyShards, LongRowsRescaleTheRunningSum) {
  REQUIRE_GPU();
  for (const int64_t V : {int64_t{9000}, int64_t{1001}}) {
    SCOPED_TRACE("V=" + std::to_string(V));
    const int64_t N = 3;
    std::vector<float> x = randn(N * V, 72, 0.5f);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < V; ++j) x[n * V + j] += 20.0f * float(j) / float(V);
    x = round_bf16(x);
    std::vector<int32_t> tg(N, 1);
    OwnedTensor dtg(DType::I32, Shape{N}, Device::CUDA);
    copy_tensor(dtg, cpu(tg, {N}));
    Dev logits(x, {N, V}), mx = zeros({N}, DType::F32), se = zeros({N}, DType::F32), tl = zeros({N}, DType::F32);
    vocab_max_sumexp_target(mx, se, tl, logits, dtg, 0, V);
    EXPECT_LE(rel(se.get(), row_sums_f64(x, N, V).sumexp), 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(Widths, CrossEntropy,
                         ::testing::Values(std::pair<int64_t, int64_t>{50, 45}, std::pair<int64_t, int64_t>{64, 61}));

// n % 4 == 0 and aligned: the 16-byte path; one element in: the scalar path.
TEST(Optimizer, SumSquaresBothPathsMatchCpu) {
  REQUIRE_GPU();
  const int64_t n = 3 * 4096;
  for (bool misalign : {false, true}) {
    Dev g(randn(n, 84), {n}, DType::F32, misalign);
    std::vector<float> gh = g.host;
    const double ss = sum_squares(g), want = sum_squares(cpu(gh, {n}));
    EXPECT_NEAR(ss, want, 1e-9 * want) << "misalign=" << misalign;
    EXPECT_EQ(ss, sum_squares(g)) << "not deterministic";
  }
}

// n = 10008 takes the kernels' 16-byte paths (AdamW, the scale); 10007 and a misaligned p
// AdamW's scalar one, 10007 the scale's.
class AdamWKernel : public ::testing::TestWithParam<std::tuple<int64_t, bool>> {};

TEST_P(AdamWKernel, StepSumSquaresScaleMatchCpu) {
  REQUIRE_GPU();
  const auto [n, misalign] = GetParam();
  Dev p(randn(n, 80), {n}, DType::F32, misalign), g(randn(n, 81), {n}, DType::F32),
      m(randn(n, 82, 0.1f), {n}, DType::F32);
  std::vector<float> v0 = randn(n, 83, 0.1f);
  for (float& x : v0) x = x * x;
  Dev v(v0, {n}, DType::F32), pc = zeros({n});
  const AdamWHyper h{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.19f, 0.0975f};
  adamw_step(p, g, m, v, h, pc);
  std::vector<float> ph = p.host, gh = g.host, mh = m.host, vh = v0;
  adamw_step(cpu(ph, {n}), cpu(gh, {n}), cpu(mh, {n}), cpu(vh, {n}), h);
  EXPECT_LE(rel(p.get(), ph), 1e-6);
  EXPECT_LE(rel(m.get(), mh), 1e-6);
  EXPECT_LE(rel(v.get(), vh), 1e-6);
  EXPECT_EQ(pc.get(), round_bf16(p.get())) << "the compute copy is the rounded master weight";
  const double ss = sum_squares(g), want = sum_squares(cpu(gh, {n}));
  EXPECT_NEAR(ss, want, 1e-9 * want);
  EXPECT_EQ(ss, sum_squares(g)) << "not deterministic";
  scale_inplace(g, 0.5f);
  for (float& x : gh) x *= 0.5f;
  EXPECT_EQ(g.get(), gh);
}
INSTANTIATE_TEST_SUITE_P(Lengths, AdamWKernel,
                         ::testing::Values(std::make_tuple(int64_t{10008}, false), std::make_tuple(int64_t{10007}, false),
                                           std::make_tuple(int64_t{10008}, true)));

// ---- the whole model ------------------------------------------------------------------

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double e = 0, s = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) e += (double(got[i]) - want[i]) * (double(got[i]) - want[i]), s += double(want[i]) * want[i];
  return std::sqrt(e / s);
}

class ModelStep : public ::testing::TestWithParam<NormScheme> {};
}  // namespace
void PrintTo(NormScheme s, std::ostream* os) { *os << norm_scheme_name(s); }
namespace {

// One forward, loss and backward of the same weights and batch on both devices: the
// loss and every parameter gradient (relative L2 error <= kStep). The GPU stage stores
// the FFN and vocabulary padded to 64 (gemm_dim_align): F = 45 and V = 53 as 64, so
// every step here also checks that the padding is the same function.
// `before` runs on both stages after their weights are drawn (FP8: the scales a first
// step sets); `tol` replaces kStep (FP8: see Fp8GpuStepMatchesCpuFp8Step).
void gpu_step_matches_cpu_step(const LlamaConfig& c, const char* what,
                               const std::function<void(LlamaStage& host, LlamaStage& gpu)>& before = {},
                               double tol = kStep) {
  const int64_t B = 2, T = 16;
  std::vector<int32_t> ids(B * T), tg(B * T);
  for (int64_t i = 0; i < B * T; ++i) ids[i] = int32_t((i * 17 + 3) % c.vocab_size), tg[i] = int32_t((i * 5 + 1) % c.vocab_size);
  tg[7] = kIgnoreIndex;
  LlamaStage host(c, StageSpec::whole(c), B, T), gpu(c, StageSpec::whole(c), B, T, 1, {}, Device::CUDA);
  host.init_weights(7), gpu.init_weights(7);
  if (before) before(host, gpu);
  host.set_gate_noise(7, 0), gpu.set_gate_noise(7, 0);  // routed layers: training noise
  host.forward(cpu(ids, {B, T})), gpu.forward(cpu(ids, {B, T}));
  const double lc = host.loss(cpu(tg, {B * T})), lg = gpu.loss(cpu(tg, {B * T}));
  EXPECT_NEAR(lg, lc, 2e-2 * std::abs(lc)) << "summed loss";
  const float scale = 1.0f / (B * T - 1);
  host.backward({}, scale), gpu.backward({}, scale);
  gpu.params().download(/*grads=*/true);
  double worst = 0;
  for (int i = 0; i < host.params().size(); ++i) {
    const Tensor hg = host.params().grad(i), gg = gpu.params().host_grad(i);
    const std::vector<float> a = test::real_elements(gpu.params().info(i), gg.f32()),
                             b = test::real_elements(host.params().info(i), hg.f32());
    ASSERT_EQ(a.size(), b.size()) << host.params().info(i).name;
    const ParamInfo& gi = gpu.params().info(i);
    const std::vector<float> all(gg.f32(), gg.f32() + gg.numel());
    EXPECT_EQ(std::count(all.begin(), all.end(), 0.0f) - std::count(a.begin(), a.end(), 0.0f),
              gi.shape.numel() - int64_t(a.size()))
        << gi.name << ": a gradient in the stored padding is not zero";
    const double e = rel_l2(a, b);
    const ParamKind kind = host.params().info(i).kind;
    if (kind == ParamKind::BranchScale || kind == ParamKind::Router) {
      // A learned branch scale's gradient is one dot product sum(dr * F) over N*C
      // terms of both signs, taken from bf16 activations and gradients on the GPU: its
      // relative error is not bounded by kStep (measured under emulation: up to 0.59).
      // A router's gradient comes from the same kind of sum (the gate's, over the
      // sequence's T*C outputs). The ops themselves are checked on identical inputs by
      // ScaledResidual.* and Route.*; here only that it is finite, and its error is printed.
      for (float v : a) EXPECT_TRUE(std::isfinite(v)) << host.params().info(i).name;
      std::printf("[ gpu step ] %s: %s relative error %.2e (not bounded, see above)\n",
                  what, host.params().info(i).name.c_str(), e);
      continue;
    }
    worst = std::max(worst, e);
    EXPECT_LE(e, tol) << host.params().info(i).name;
  }
  std::printf("[ gpu step ] %s: loss cpu %.6f gpu %.6f, worst gradient relative L2 error %.2e\n", what, lc, lg,
              worst);
}

TEST_P(ModelStep, GpuStepMatchesCpuStep) {
  REQUIRE_GPU();
  LlamaConfig c = test::small_model(GetParam());
  c.hidden_size = 64, c.num_heads = 4, c.num_kv_heads = 2;  // head dim 16
  gpu_step_matches_cpu_step(c, norm_scheme_name(GetParam()));
}

// The 1B configs' FFN width: 5461 is stored as 5504 on the GPU (a row pitch of 11008
// bytes instead of 10922), checked against the CPU's unpadded 5461.
TEST(ModelStep, FfnOf5461StoredAs5504MatchesCpuStep) {
  REQUIRE_GPU();
  LlamaConfig c = test::small_model(NormScheme::LNS);
  c.hidden_size = 64, c.num_heads = 4, c.num_kv_heads = 2, c.num_layers = 2, c.intermediate_size = 5461;
  LlamaStage gpu(c, StageSpec::whole(c), 1, 4, 1, {}, Device::CUDA);
  const ParamInfo& down = gpu.params().info(gpu.params().find("model.layers.0.mlp.down_proj.weight"));
  EXPECT_EQ(down.shape, Shape({64, 5504}));
  EXPECT_EQ(down.logical, Shape({64, 5461}));
  EXPECT_EQ(down.shard_size, 5461);
  gpu_step_matches_cpu_step(c, "lns, F = 5461");
}

// The FP8 linear on CUDA (the casts of src/cuda/fp8_cast.cu and fp8_tiles.cu, cuBLASLt's FP8 matmul) against
// the CPU reference on the same bf16 values and table: the health the casts record is
// equal exactly (same codes, same counts); the products agree to the bf16 output's
// rounding (y, dx) or f32 summation order (dw), since both sum the same exact products.
// A scale of 8 on x saturates some of its values, which both must count alike; x's 19 x 16
// tiles are more than the 256 threads that merge their health.
#ifdef LNS_WITH_CUDA  // the wrapper exists in CUDA and emulation builds only
// The block-scaled FP8 product (--fp8=blockwise's GEMMs) through gemm(): A [32, 272] with
// 1 x 128 tile factors, B [144, 272] with 128 x 128 ones, in the layouts gemm.h states;
// the reference sums each K tile in f64 and multiplies it by both tiles' factors. K's last
// tile is partial and B's second row block too; the tensors' padding holds NaN, which a
// product reading it would show. On a GPU this checks the layouts against cuBLASLt itself.
TEST(GemmFp8, BlockScalesMultiplyEachTilesProduct) {
  REQUIRE_GPU();
  const int64_t M = 32, N = 144, K = 272, tiles = 3;
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> code(0, 255), expo(-4, 4);
  const auto codes = [&](int64_t n) {
    std::vector<uint8_t> c(static_cast<size_t>(n));
    for (auto& v : c)
      do v = uint8_t(code(rng));
      while (!std::isfinite(fp8_to_f32(v, Fp8Format::E4M3)));
    return c;
  };
  const std::vector<uint8_t> a = codes(M * K), b = codes(N * K);
  const int64_t na = cuda::gemm_scale_floats(cuda::GemmScale::Vec128, M, K),
                nb = cuda::gemm_scale_floats(cuda::GemmScale::Block128, N, K);
  ASSERT_EQ(na, tiles * 32);
  ASSERT_EQ(nb, 2 * 4);
  std::vector<float> sa(size_t(na), NAN), sb(size_t(nb), NAN);
  for (int64_t t = 0; t < tiles; ++t)
    for (int64_t i = 0; i < M; ++i) sa[size_t(t * 32 + i)] = std::ldexp(1.0f, expo(rng));
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t t = 0; t < tiles; ++t) sb[size_t(r * 4 + t)] = std::ldexp(1.0f, expo(rng));
  // codes travel as I32 words (4 codes each): the tensors have no byte type
  const auto upload_codes = [](const std::vector<uint8_t>& c) {
    OwnedTensor d(DType::I32, Shape{int64_t(c.size() / 4)}, Device::CUDA);
    copy_tensor(d.t, Tensor{const_cast<uint8_t*>(c.data()), DType::I32, Device::CPU, d.t.shape});
    return d;
  };
  const OwnedTensor da = upload_codes(a), db = upload_codes(b);
  Dev dsa(sa, {na}, DType::F32), dsb(sb, {nb}, DType::F32), c = zeros({M, N}, DType::F32);
  cuda::GemmArgs g;
  g.M = M, g.N = N, g.K = K;
  g.A = da.t.data, g.lda = K, g.a_type = cuda::GemmInput::E4M3;
  g.B = db.t.data, g.ldb = K, g.trans_b = true, g.b_type = cuda::GemmInput::E4M3;
  g.C = c.t.data, g.ldc = N, g.c_dtype = DType::F32, g.alpha = 0.5f;
  g.a_scale = dsa.t.f32(), g.b_scale = dsb.t.f32();
  g.a_scale_mode = cuda::GemmScale::Vec128, g.b_scale_mode = cuda::GemmScale::Block128;
  cuda::gemm(g);
  const std::vector<float> got = c.get();
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double want = 0, mag = 0;
      for (int64_t t = 0; t < tiles; ++t) {
        double part = 0;
        for (int64_t k = t * 128; k < std::min(K, (t + 1) * 128); ++k) {
          const double p = double(fp8_to_f32(a[i * K + k], Fp8Format::E4M3)) * fp8_to_f32(b[j * K + k], Fp8Format::E4M3);
          part += p, mag += std::abs(p) * sa[t * 32 + i] * sb[(j / 128) * 4 + t];
        }
        want += part * sa[t * 32 + i] * sb[(j / 128) * 4 + t];
      }
      ASSERT_NEAR(got[i * N + j], 0.5 * want, 0.5 * mag * 1e-6 + 1e-30) << i << "," << j;
    }
}
#endif

TEST(Fp8Linear, CudaMatchesTheCpuReference) {
  REQUIRE_GPU();
  const int64_t N = 592, in = 512, out = 32;
  Dev x(randn(N * in, 1, 20.0f), {N, in}), w(randn(out * in, 2, 0.05f), {out, in}), dy(randn(N * out, 3, 1e-3f), {N, out});
  const float scale[3] = {8.0f, 4096.0f, 32768.0f};  // x, w, dy
  std::vector<float> table(3 * kFp8Fields, 0.0f);
  for (int r = 0; r < 3; ++r) table[r * kFp8Fields + kFp8Scale] = scale[r], table[r * kFp8Fields + kFp8ScaleInv] = 1.0f / scale[r];
  Dev tab(table, {3, kFp8Fields}, DType::F32);
  Dev y = zeros({N, out}), dx(randn(N * in, 4, 0.1f), {N, in}), dw(randn(out * in, 5, 0.01f), {out, in}, DType::F32);
  linear_forward_fp8(y, x, w, {tab, 0, 1, 2});
  linear_backward_fp8(dx, dw, dy, x, w, /*accumulate_dx=*/true, {tab, 0, 1, 2});
  std::vector<float> xh = x.host, wh = w.host, dyh = dy.host, yh(N * out), dxh = dx.host, dwh = dw.host;
  linear_forward_fp8(cpu(yh, {N, out}), cpu(xh, {N, in}), cpu(wh, {out, in}), {cpu(table, {3, kFp8Fields}), 0, 1, 2});
  linear_backward_fp8(cpu(dxh, {N, in}), cpu(dwh, {out, in}), cpu(dyh, {N, out}), cpu(xh, {N, in}), cpu(wh, {out, in}),
                      true, {cpu(table, {3, kFp8Fields}), 0, 1, 2});
  EXPECT_LE(rel(y.get(), yh), kOut);
  EXPECT_LE(rel(dx.get(), dxh), kOut);
  EXPECT_LE(rel(dw.get(), dwh), kF32);
  const std::vector<float> got = tab.get();
  EXPECT_EQ(got, table) << "amax, scales and counts of the casts";
  EXPECT_GT(table[kFp8Saturated], 0) << "x at scale 8 must saturate somewhere";
  EXPECT_EQ(table[2 * kFp8Fields + kFp8Elements], N * out);
}

// --fp8=blockwise's CUDA op (the tile casts of src/cuda/fp8_tiles.cu and the block-scaled
// GEMMs) against the CPU op on the same bf16 values: the same tile scales and codes, so
// the health rows are equal exactly and the products agree to the output's rounding.
// Shapes cross tile edges (N 144, in 272: three K tiles, the last partial; out 160), rows
// of x and dy differ in magnitude, and w has an outlier that sets its tile's scale.
TEST(Fp8Linear, CudaBlockwiseMatchesTheCpuReference) {
  REQUIRE_GPU();
  const int64_t N = 144, in = 272, out = 160;
  std::vector<float> xv = randn(N * in, 1, 1.0f), wv = randn(out * in, 2, 0.05f), dyv = randn(N * out, 3, 1e-3f);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t i = 0; i < in; ++i) xv[n * in + i] *= std::pow(10.0f, float(n % 5 - 2) / 2.0f);
    for (int64_t o = 0; o < out; ++o) dyv[n * out + o] *= std::pow(10.0f, float(n % 3 - 1));
  }
  wv[3 * in + 3] = 1e4f;
  Dev x(xv, {N, in}), w(wv, {out, in}), dy(dyv, {N, out});
  std::vector<float> table(3 * kFp8Fields, 0.0f);
  for (int r = 0; r < 3; ++r) table[r * kFp8Fields + kFp8Scale] = table[r * kFp8Fields + kFp8ScaleInv] = 1.0f;
  Dev tab(table, {3, kFp8Fields}, DType::F32);
  Dev y = zeros({N, out}), dx(randn(N * in, 4, 0.1f), {N, in}), dw(randn(out * in, 5, 0.01f), {out, in}, DType::F32);
  const Fp8Linear gf{tab, 0, 1, 2, /*blockwise=*/true};
  linear_forward_fp8(y, x, w, gf);
  linear_backward_fp8(dx, dw, dy, x, w, /*accumulate_dx=*/true, gf);
  std::vector<float> xh = x.host, wh = w.host, dyh = dy.host, yh(N * out), dxh = dx.host, dwh = dw.host;
  const Fp8Linear cf{cpu(table, {3, kFp8Fields}), 0, 1, 2, true};
  linear_forward_fp8(cpu(yh, {N, out}), cpu(xh, {N, in}), cpu(wh, {out, in}), cf);
  linear_backward_fp8(cpu(dxh, {N, in}), cpu(dwh, {out, in}), cpu(dyh, {N, out}), cpu(xh, {N, in}), cpu(wh, {out, in}),
                      true, cf);
  EXPECT_LE(rel(y.get(), yh), kOut);
  EXPECT_LE(rel(dx.get(), dxh), kOut);
  EXPECT_LE(rel(dw.get(), dwh), kF32);
  EXPECT_EQ(tab.get(), table) << "amax and counts of the tile casts";
  EXPECT_GT(table[1 * kFp8Fields + kFp8Flushed], 0) << "w's outlier must flush some of its tile";
  EXPECT_EQ(table[2 * kFp8Fields + kFp8Elements], N * out);
}

// The shared ops on CUDA (x8 and xT8 cast once for q, k and v) against the one-linear
// ops, both modes, bit for bit (tests/common/fp8_sharing.h).
TEST(Fp8Linear, CudaSharedInputIsTheSingleOps) {
  REQUIRE_GPU();
  for (const bool blockwise : {false, true}) {
    SCOPED_TRACE(blockwise ? "blockwise" : "delayed");
    test::expect_shared_input_is_the_single_ops(Device::CUDA, blockwise);
  }
}

// The whole --fp8 step on CUDA against the CPU's --fp8 step, both casting with the scales
// a first CPU step set (as every step after a run's first does). The ops themselves are
// held tight by Fp8Linear.CudaMatchesTheCpuReference (the same codes and counts); a
// whole step cannot be: the GPU casts bf16 activations and weights where the CPU casts
// f32 ones, and a perturbation d of a value moves its FP8 code by one spacing s with
// probability d/s, an error of about sqrt(d s) rms: bf16's d = 2^-9 against E4M3's s ~
// 2^-3.5 is 1.3% per operand, where bf16 itself adds 0.2%. Compounded through the five
// blocks' chained FP8 GEMMs, forward and back, the gradients differ by 4% (the LM head,
// last) to 22% (k_proj of the middle blocks; measured 2026-11-28, under emulation), as
// far as the CPU's FP8 step is from its f32 step (7% to 21%). Hence 0.3 here; an operand
// in the wrong layout or an unapplied scale gives errors near or above 100% (measured:
// dy's untransposed codes in the weight gradient's product); the op test catches the
// subtler ones.
TEST(ModelStep, Fp8GpuStepMatchesCpuFp8Step) {
  REQUIRE_GPU();
  LlamaConfig c = test::small_model(NormScheme::LNS);
  c.hidden_size = 64, c.num_heads = 4, c.num_kv_heads = 2, c.fp8 = Fp8Mode::Delayed;
  gpu_step_matches_cpu_step(c, "lns, --fp8=delayed", [&](LlamaStage& host, LlamaStage& gpu) {
    const int64_t B = 2, T = 16;
    std::vector<int32_t> ids(B * T), tg(B * T);
    for (int64_t i = 0; i < B * T; ++i) ids[i] = int32_t((i * 7 + 1) % c.vocab_size), tg[i] = int32_t((i * 3 + 2) % c.vocab_size);
    host.forward(cpu(ids, {B, T}));
    host.loss(cpu(tg, {B * T}));
    host.backward({}, 1.0f / (B * T));
    host.params().zero_grads();
    host.fp8()->end_step({});
    gpu.fp8()->restore(host.fp8()->state(), "the CPU's scales");
  }, 0.3);
}

// The same for --fp8=blockwise, with the same tolerance and for the same reason (bf16
// against f32 values cast to 8 bits); no scales to carry over.
TEST(ModelStep, Fp8BlockwiseGpuStepMatchesCpuStep) {
  REQUIRE_GPU();
  LlamaConfig c = test::small_model(NormScheme::LNS);
  c.hidden_size = 64, c.num_heads = 4, c.num_kv_heads = 2, c.fp8 = Fp8Mode::Blockwise;
  gpu_step_matches_cpu_step(c, "lns, --fp8=blockwise", {}, 0.3);
}

// The weights cast once per step on CUDA (fp8_cast_weight: w8 and wT8 in one pass, and
// under blockwise both directions' tile factors, carved from one buffer) against each
// op casting w itself: the same losses and gradients bit for bit over two steps with
// a weight update between them (tests/common/fp8_sharing.h).
TEST(ModelStep, Fp8StepCastsAreThePerCallCasts) {
  REQUIRE_GPU();
  for (const Fp8Mode m : {Fp8Mode::Delayed, Fp8Mode::Blockwise}) {
    LlamaConfig c = test::small_model(NormScheme::LNS);
    c.hidden_size = 64, c.num_heads = 4, c.num_kv_heads = 2, c.fp8 = m;
    c.num_layers = 2;  // two blocks show it; five took 37 s under ASan's emulation
    SCOPED_TRACE(fp8_mode_name(m));
    test::expect_step_casts_are_per_call_casts(c, Device::CUDA);
  }
}

// What cuBLASLt's FP8 matmul needs is said before a step runs, in one line.
TEST(ModelStep, Fp8RefusesShapesCublasLtCannotTake) {
  REQUIRE_GPU();
  LlamaConfig c = test::small_model(NormScheme::LNS);
  c.hidden_size = 64, c.num_heads = 4, c.num_kv_heads = 2, c.fp8 = Fp8Mode::Delayed;
  try {
    LlamaStage gpu(c, StageSpec::whole(c), 1, 4, 1, {}, Device::CUDA);
    ADD_FAILURE() << "4 tokens per micro-batch were accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--fp8=delayed on CUDA needs the tokens of a micro-batch (--micro_batch_size "
                                         "x --seq_len) to be a multiple of 16 (cuBLASLt's FP8 GEMMs), got 4"),
              std::string::npos)
        << e.what();
  }
}

// A model whose norms lns_convert fold-norms folded away (docs/ln_free.md): blocks without
// pre-norms, a head that reads the residual stream, an untied lm_head; the same stage
// code on both devices.
TEST(ModelStep, FoldedNormsMatchCpuStep) {
  REQUIRE_GPU();
  for (NormScheme s : {NormScheme::LNS, NormScheme::ScaleResPre}) {
    LlamaConfig c = test::small_model(s);
    c.hidden_size = 64, c.num_heads = 4, c.num_kv_heads = 2, c.folded_norms = true;
    gpu_step_matches_cpu_step(c, (std::string("folded ") + norm_scheme_name(s)).c_str());
  }
}

// A checkpoint written from the GPU's padded storage has the bytes of the CPU's: the
// same weights and moments (AdamW state set from the same values) give identical rank
// files, so checkpoints do not depend on the device (docs/checkpoints.md).
TEST(Padding, GpuCheckpointHasTheCpusBytes) {
  REQUIRE_GPU();
  LlamaConfig c = test::small_model(NormScheme::LNS);  // F = 45, V = 53: stored as 64 on the GPU
  c.hidden_size = 64, c.num_heads = 4, c.num_kv_heads = 2, c.num_layers = 2;
  LlamaStage host(c, StageSpec::whole(c), 1, 4), gpu(c, StageSpec::whole(c), 1, 4, 1, {}, Device::CUDA);
  host.init_weights(11), gpu.init_weights(11);
  gpu.params().download();
  ASSERT_NE(gpu.params().numel(), host.params().numel()) << "the GPU does not pad";
  AdamW ho(host.params(), {}), go(gpu.params(), {});
  // Moments: the same value for the same logical element on both, zero in padding.
  for (int i = 0; i < host.params().size(); ++i) {
    const ParamInfo &hp = host.params().info(i), &gp = gpu.params().info(i);
    const int64_t hcols = hp.shape.ndim > 1 ? hp.shape[1] : 1, gcols = gp.shape.ndim > 1 ? gp.shape[1] : 1;
    for (int64_t k = 0; k < gp.shape.numel(); ++k) {
      int64_t li, lj;
      const bool real = gp.to_logical(k / gcols, k % gcols, &li, &lj);
      go.exp_avg().f32()[gp.offset + k] = real ? 0.001f * float(i * 131 + li * 7 + lj) : 0.0f;
      go.exp_avg_sq().f32()[gp.offset + k] = real ? 1e-6f * float(li + lj + 1) : 0.0f;
    }
    for (int64_t k = 0; k < hp.shape.numel(); ++k) {
      int64_t li, lj;
      hp.to_logical(k / hcols, k % hcols, &li, &lj);
      ho.exp_avg().f32()[hp.offset + k] = 0.001f * float(i * 131 + li * 7 + lj);
      ho.exp_avg_sq().f32()[hp.offset + k] = 1e-6f * float(li + lj + 1);
    }
  }
  const std::string base = ::testing::TempDir() + "/lns_pad_ckpt_" + std::to_string(::getpid());
  std::vector<std::string> bytes;
  for (const auto& [ps, opt, dir] : {std::tuple{&host.params(), &ho, base + "_cpu"}, {&gpu.params(), &go, base + "_gpu"}}) {
    std::filesystem::create_directories(dir);
    const nlohmann::json shard = write_rank_shard(dir, *ps, opt, Layout{}, RankCoords{});
    std::ifstream f(dir + "/" + shard["name"].get<std::string>(), std::ios::binary);
    bytes.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    std::filesystem::remove_all(dir);
  }
  ASSERT_GT(bytes[0].size(), 1000u);
  EXPECT_TRUE(bytes[0] == bytes[1]) << "rank files differ: " << bytes[0].size() << " vs " << bytes[1].size()
                                    << " bytes";
}

INSTANTIATE_TEST_SUITE_P(Schemes, ModelStep,
                         ::testing::Values(NormScheme::Pre, NormScheme::LNS, NormScheme::Post, NormScheme::Sandwich,
                                           NormScheme::ScaleResPre, NormScheme::Hybrid, NormScheme::Mono,
                                           // post layers that normalise the MLP input twice
                                           NormScheme::MonoReverse),
                         [](const auto& info) { return std::string(norm_scheme_name(info.param)); });

// LN-free (docs/ln_free.md) through the same stage code on both devices: the divisors
// measured by each device's calibration agree, and with every pre-norm and the final
// norm fixed (LNS: the constant composes with the depth scale; q/k and v apart, v and
// the final norm with end-of-text rows) a step matches the CPU's.
// Without the norms' renormalisation the bf16 errors grow: measured under emulation
// (2026-11-25) q/k projection gradients 5.5e-2 to 6.6e-2 relative L2 (the same model
// with live norms: 2.1e-2; with a worse position-0 constant, 1.2e-1), so the bound here
// is kLnFreeStep = 1e-1; the ops themselves agree to 1e-2 (NormFixed.*).
TEST(ModelStep, LnFreeCalibrationAndFixedStepMatchCpu) {
  REQUIRE_GPU();
  LlamaConfig c = test::small_model(NormScheme::LNS);
  c.hidden_size = 64;
  const int64_t B = 2, T = 8;
  std::vector<int32_t> ids(B * T), tg(B * T);
  for (int64_t i = 0; i < B * T; ++i) ids[i] = int32_t((i * 13 + 5) % c.vocab_size), tg[i] = int32_t((i * 3 + 2) % c.vocab_size);
  LlamaStage host(c, StageSpec::whole(c), B, T), gpu(c, StageSpec::whole(c), B, T, 1, {}, Device::CUDA);
  host.init_weights(11), gpu.init_weights(11);
  host.forward(cpu(ids, {B, T})), gpu.forward(cpu(ids, {B, T}));
  std::vector<std::array<double, 4>> hs, gs;
  host.add_divisor_sums(hs), gpu.add_divisor_sums(gs);
  ASSERT_EQ(hs.size(), gs.size());
  ASSERT_EQ(hs.size(), size_t(2 * c.num_layers + 1));
  for (size_t j = 0; j < hs.size(); ++j) {
    EXPECT_EQ(gs[j][1], hs[j][1]);
    EXPECT_EQ(gs[j][3], hs[j][3]);
    for (int k : {0, 2}) EXPECT_NEAR(gs[j][k], hs[j][k], 2e-2 * hs[j][k]) << j;  // bf16 activations
  }
  // The recipe's final state before its drops: the MLP and q/k at the calibrated
  // constants, v and the final norm with the end-of-text case (token ids[3], at position
  // 3; the kernel reads the ids on the device), v's position-0 constant tripled so that
  // the case moves the loss by more than twice the tolerance (checked below). Measured
  // under emulation (2026-11-25): the loss 67.176 (CPU) vs 67.164 (GPU), 1.8e-4
  // relative; without v's end-of-text case 68.700; worst gradient 2.7e-2.
  const int32_t eot = ids[3];
  auto fix = [&](LlamaStage& st, int32_t v_eot) {
    for (int l = 0; l <= c.num_layers; ++l)
      for (const DivisorSlot slot : {DivisorSlot::Mlp, DivisorSlot::AttnQK, DivisorSlot::AttnV, DivisorSlot::Final}) {
        if ((l == c.num_layers) != (slot == DivisorSlot::Final)) continue;
        const auto& s = hs[divisor_sums_index(l, slot)];
        const float pos0 = float(s[0] / s[1]), rest = float(s[2] / s[3]);
        if (slot == DivisorSlot::AttnV) st.set_fixed_divisor(l, slot, 3 * pos0, rest, v_eot);
        else st.set_fixed_divisor(l, slot, pos0, rest, slot == DivisorSlot::Final ? eot : -1);
      }
  };
  fix(host, eot), fix(gpu, eot);
  host.forward(cpu(ids, {B, T})), gpu.forward(cpu(ids, {B, T}));
  const double lc = host.loss(cpu(tg, {B * T})), lg = gpu.loss(cpu(tg, {B * T}));
  const double kLoss = 5e-3;  // bf16 activations; measured 1.8e-4 (above)
  EXPECT_NEAR(lg, lc, kLoss * std::abs(lc));
  {  // without v's end-of-text case the loss is another: the comparison above can fail
    LlamaStage other(c, StageSpec::whole(c), B, T);
    other.init_weights(11);
    fix(other, -1);
    other.forward(cpu(ids, {B, T}));
    EXPECT_GT(std::abs(other.loss(cpu(tg, {B * T})) - lc), 2 * kLoss * std::abs(lc));
  }
  host.backward({}, 1.0f / (B * T)), gpu.backward({}, 1.0f / (B * T));
  gpu.params().download(/*grads=*/true);
  double worst = 0;
  for (int i = 0; i < host.params().size(); ++i) {
    const Tensor hg = host.params().grad(i), gg = gpu.params().host_grad(i);
    // The GPU stores the FFN and vocabulary padded (F = 45 as 64): compare real elements.
    const double e = rel_l2(test::real_elements(gpu.params().info(i), gg.f32()),
                            test::real_elements(host.params().info(i), hg.f32()));
    worst = std::max(worst, e);
    EXPECT_LE(e, 1e-1) << host.params().info(i).name;  // kLnFreeStep, see above
  }
  std::printf("[ gpu step ] ln-free lns: loss cpu %.6f gpu %.6f, worst gradient relative L2 error %.2e\n", lc, lg,
              worst);
}

TEST(ModelStep, TwoIdenticalGpuStepsAreBitwiseEqual) {
  REQUIRE_GPU();
  const LlamaConfig c = test::small_model(NormScheme::LNS);
  const int64_t B = 2, T = 8;
  std::vector<int32_t> ids(B * T), tg(B * T);
  for (int64_t i = 0; i < B * T; ++i) ids[i] = int32_t(i % c.vocab_size), tg[i] = int32_t((i + 1) % c.vocab_size);
  std::vector<std::vector<float>> grads;
  std::vector<double> losses;
  for (int run = 0; run < 2; ++run) {
    LlamaStage s(c, StageSpec::whole(c), B, T, 1, {}, Device::CUDA);
    s.init_weights(3);
    s.forward(cpu(ids, {B, T}));
    losses.push_back(s.loss(cpu(tg, {B * T})));
    s.backward({}, 1.0f / (B * T));
    grads.push_back(to_host_f32(s.params().flat_grads()));
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(0, std::memcmp(grads[0].data(), grads[1].data(), grads[0].size() * 4));
}

// The op profile (lns_bench_step --profile) sees every op a step sends to the GPU,
// in a class of its table, and changes nothing it times: the same gradients bit for
// bit with and without it. Each linear and each norm has one backward per forward, so
// a forward-and-backward profile holds twice the forward's GEMMs and norms.
TEST(OpProfile, ClassifiesEveryOpOfAStepAndChangesNothing) {
  REQUIRE_GPU();
  EXPECT_EQ(op_class_of_file("/x/src/cpu/linear.cpp"), "GEMMs (cuBLASLt)");
  EXPECT_EQ(op_class_of_file("src/cpu/cross_entropy.cpp"), "embedding, cross-entropy");
  EXPECT_EQ(op_class_of_file("/x/src/cpu/new_op.cpp"), "new_op");
  const LlamaConfig c = test::small_model(NormScheme::LNS);
  const int64_t B = 2, T = 8;
  std::vector<int32_t> ids(B * T), tg(B * T);
  for (int64_t i = 0; i < B * T; ++i) ids[i] = int32_t(i % c.vocab_size), tg[i] = int32_t((i + 1) % c.vocab_size);
  auto count = [](const std::vector<OpClassTime>& rows, const std::string& name) {
    for (const auto& r : rows)
      if (r.name == name) return r.ops;
    return int64_t{-1};
  };
  std::vector<std::vector<float>> grads;
  std::vector<OpClassTime> fwd, both;
  for (int profiled = 0; profiled < 2; ++profiled) {
    LlamaStage s(c, StageSpec::whole(c), B, T, 1, {}, Device::CUDA);
    s.init_weights(3);
    if (profiled) op_profile_start();
    s.forward(cpu(ids, {B, T}));
    if (profiled) fwd = op_profile_stop(), op_profile_start();
    s.loss(cpu(tg, {B * T}));
    s.backward({}, 1.0f / (B * T));
    if (profiled) {
      const std::vector<OpClassTime> rest = op_profile_stop();
      both = fwd;
      for (size_t i = 0; i < both.size(); ++i) both[i].ops += rest.at(i).ops, both[i].ms += rest.at(i).ms;
    }
    grads.push_back(to_host_f32(s.params().flat_grads()));
  }
  EXPECT_EQ(0, std::memcmp(grads[0].data(), grads[1].data(), grads[0].size() * 4)) << "the profile changed the step";
  ASSERT_EQ(both.size(), op_classes().size()) << "an op of a class the table does not name";
  for (size_t i = 0; i < both.size(); ++i) {
    EXPECT_EQ(both[i].name, op_classes()[i]);
    EXPECT_GE(both[i].ms, 0.0) << both[i].name;
    if (both[i].name != "optimizer, gradient norm" && both[i].name != "FP8 casts (scale, amax, transpose)") {
      EXPECT_GT(both[i].ops, 0) << both[i].name;
    }
  }
  const std::string gemm = "GEMMs (cuBLASLt)", norm = "norms with residual adds and LNS scale";
  EXPECT_EQ(count(fwd, gemm), 7 * c.num_layers + 1) << "q, k, v, o, gate, up, down per layer and the head";
  EXPECT_EQ(count(both, gemm), 2 * count(fwd, gemm));
  EXPECT_EQ(count(both, norm), 2 * count(fwd, norm));
}

// Under --fp8 the casts inside the FP8 linears are a row of their own, cut out of the
// GEMMs' time (cuda::ProfileSegment), and the count shows what is cast: per block, one
// x for q/k/v, one for o, one for gate/up, one for down, plus the seven weights when no
// step cast was made (Fp8State::begin_step); with it, the weights are cast there, once.
TEST(OpProfile, Fp8CastsAreARowOfTheirOwn) {
  REQUIRE_GPU();
  LlamaConfig c = test::small_model(NormScheme::LNS);
  c.hidden_size = 64, c.num_heads = 4, c.num_kv_heads = 2, c.num_layers = 2, c.fp8 = Fp8Mode::Delayed;
  const int64_t B = 2, T = 16;
  std::vector<int32_t> ids(B * T);
  for (int64_t i = 0; i < B * T; ++i) ids[i] = int32_t(i % c.vocab_size);
  LlamaStage s(c, StageSpec::whole(c), B, T, 1, {}, Device::CUDA);
  s.init_weights(3);
  const std::string casts = "FP8 casts (scale, amax, transpose)";
  auto profile_forward = [&] {
    op_profile_start();
    s.forward(cpu(ids, {B, T}));
    const std::vector<OpClassTime> rows = op_profile_stop();
    EXPECT_EQ(rows.size(), op_classes().size()) << "an op of a class the table does not name";
    for (const OpClassTime& r : rows)
      if (r.name == casts) return r.ops;
    return int64_t{-1};
  };
  EXPECT_EQ(profile_forward(), (4 + 7) * c.num_layers) << "per-call weight casts";
  s.fp8()->begin_step();
  EXPECT_EQ(profile_forward(), 4 * c.num_layers) << "weights cast once, by begin_step";
}

#ifdef LNS_WITH_CUDA
// A watch registered with the CUDA runtime runs while synchronize() waits and can end
// the wait (the NCCL communicator's async-error check: a failed peer stops the job
// instead of hanging it). Here a watch that throws at its first call.
TEST(Runtime, SyncWatchEndsAWait) {
  REQUIRE_GPU();
#ifdef LNS_CUDA_SIM
  // The emulator holds queued work until a sync point (a query answers NotReady first):
  // any size is pending here, and 8 GiB of emulated writes took 48 s under ASan.
  const int64_t n = int64_t{1} << 16;
#else
  const int64_t n = int64_t{1} << 28;  // 1 GiB: 8 passes are a few ms of work on a GPU
#endif
  OwnedTensor big(DType::F32, Shape{n}, Device::CUDA);
  for (int i = 0; i < 8; ++i) zero_tensor(big);
  if (cudaStreamQuery(cuda::stream()) == cudaSuccess)
    GTEST_SKIP() << "skipped: the work finished before the wait (an emulator runs it at once)";
  int calls = 0;
  cuda::add_sync_watch([](void* ctx) { ++*static_cast<int*>(ctx); throw UserError("watch fired"); }, &calls);
  EXPECT_THROW(device_synchronize(Device::CUDA), UserError);
  cuda::remove_sync_watch(&calls);
  device_synchronize(Device::CUDA);  // no watch: a plain wait
  EXPECT_EQ(calls, 1);
}
#endif

TEST(Device, StatusIsReported) {
  // Runs everywhere: the line a skipped run shows, and what a GPU run binds.
  if (cuda_device_count() == 0) {
    std::printf("[ gpu ] %s\n", cuda_unavailable_reason().c_str());
    EXPECT_FALSE(cuda_unavailable_reason().empty());
  } else {
    EXPECT_EQ(bind_local_gpu(0), 0);
    std::printf("[ gpu ] %s\n", current_gpu_description().c_str());
  }
}

}  // namespace
}  // namespace lns
