// Every CPU op: forward against a plain f64 reference written here, backward against
// central finite differences of that reference. Odd sizes (C = 36, 45; F = 45) on
// purpose. Tolerances: forward 2e-6 relative to the output's largest entry (f32
// rounding), backward 1e-4 (f32 kernel vs f64 finite differences with h = 1e-6).
#include <cstring>
#include <set>
#include <string>

#include "lns/core/device.h"
#include "lns/core/fp8_linear.h"
#include "lns/core/ops.h"
#include "lns/model/rope.h"
#include "test_util.h"

namespace lns {
namespace {

using namespace lns::test;
using Vec = std::vector<double>;

constexpr double kFwdTol = 2e-6, kBwdTol = 1e-4;

// ---- f64 references -----------------------------------------------------------------
Vec norm_ref(NormType type, const Vec& x, const Vec& g, const Vec& b, double scale, double eps,
             int64_t N, int64_t C) {
  Vec out(N * C);
  for (int64_t n = 0; n < N; ++n) {
    double mean = 0, var = 0;
    if (type == NormType::LayerNorm) {
      for (int64_t c = 0; c < C; ++c) mean += x[n * C + c];
      mean /= C;
    }
    for (int64_t c = 0; c < C; ++c) var += (x[n * C + c] - mean) * (x[n * C + c] - mean);
    const double rstd = 1.0 / std::sqrt(var / C + eps);
    for (int64_t c = 0; c < C; ++c)
      out[n * C + c] = scale * ((x[n * C + c] - mean) * rstd * g[c] + (b.empty() ? 0.0 : b[c]));
  }
  return out;
}

// The norm with its divisor a constant: d0 at position 0 (row n % T == 0), d elsewhere.
Vec norm_fixed_ref(NormType type, const Vec& x, const Vec& g, const Vec& b, double scale,
                   double d0, double d, int64_t T, int64_t N, int64_t C) {
  Vec out(N * C);
  for (int64_t n = 0; n < N; ++n) {
    double mean = 0;
    if (type == NormType::LayerNorm) {
      for (int64_t c = 0; c < C; ++c) mean += x[n * C + c];
      mean /= C;
    }
    const double div = n % T == 0 ? d0 : d;
    for (int64_t c = 0; c < C; ++c)
      out[n * C + c] = scale * ((x[n * C + c] - mean) / div * g[c] + (b.empty() ? 0.0 : b[c]));
  }
  return out;
}

Vec linear_ref(const Vec& x, const Vec& w, int64_t N, int64_t in, int64_t out) {
  Vec y(N * out, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) y[n * out + o] += x[n * in + i] * w[o * in + i];
  return y;
}

Vec rope_ref(Vec x, int64_t B, int64_t T, int64_t H, int64_t D, double theta) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        double* v = &x[((b * T + t) * H + h) * D];
        for (int64_t j = 0; j < D / 2; ++j) {
          const double a = t / std::pow(theta, 2.0 * j / D), x1 = v[j], x2 = v[j + D / 2];
          v[j] = x1 * std::cos(a) - x2 * std::sin(a);
          v[j + D / 2] = x2 * std::cos(a) + x1 * std::sin(a);
        }
      }
  return x;
}

Vec attention_ref(const Vec& q, const Vec& k, const Vec& v, int64_t B, int64_t T, int64_t Hq,
                  int64_t Hkv, int64_t D) {
  Vec out(B * T * Hq * D, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / (Hq / Hkv);
      for (int64_t i = 0; i < T; ++i) {
        Vec s(i + 1);
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (int64_t e = 0; e < D; ++e)
            d += q[((b * T + i) * Hq + h) * D + e] * k[((b * T + j) * Hkv + g) * D + e];
          s[j] = d / std::sqrt(double(D));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (auto& sj : s) z += (sj = std::exp(sj - mx));
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t e = 0; e < D; ++e)
            out[((b * T + i) * Hq + h) * D + e] += s[j] / z * v[((b * T + j) * Hkv + g) * D + e];
      }
    }
  return out;
}

double ce_ref(const Vec& logits, const std::vector<int32_t>& t, int64_t N, int64_t V) {
  double sum = 0;
  int count = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (t[n] == kIgnoreIndex) continue;
    double mx = -1e300, z = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, logits[n * V + j]);
    for (int64_t j = 0; j < V; ++j) z += std::exp(logits[n * V + j] - mx);
    sum += std::log(z) + mx - logits[n * V + t[n]];
    ++count;
  }
  return sum / count;
}

// ---- embedding ------------------------------------------------------------------------
TEST(Ops, EmbeddingForwardBackward) {
  const int64_t V = 11, C = 36, N = 9;
  auto w = randn(V * C, 1);
  std::vector<int32_t> ids = {3, 0, 10, 3, 7, 3, 1, 0, 9};  // repeats accumulate
  std::vector<float> out(N * C), dw(V * C, 0.0f);
  embedding_forward(view(out, {N, C}), view(ids, {N}), view(w, {V, C}));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(out[n * C + c], w[ids[n] * C + c]);
  auto dout = randn(N * C, 2);
  embedding_backward(view(dw, {V, C}), view(ids, {N}), view(dout, {N, C}));
  Vec want(V * C, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) want[ids[n] * C + c] += dout[n * C + c];
  expect_close(dw, want, 1e-7, "dweight");
}

// ---- norms ----------------------------------------------------------------------------
struct NormCase {
  NormType type;
  int64_t C;
  float scale;
};

class NormOps : public ::testing::TestWithParam<NormCase> {};

TEST_P(NormOps, ForwardMatchesF64) {
  const auto [type, C, scale] = GetParam();
  const int64_t N = 5;
  const bool ln = type == NormType::LayerNorm;
  auto x = randn(N * C, 3, 1.5f, 0.3f), g = randn(C, 4, 0.2f, 1.0f);
  auto b = ln ? randn(C, 5, 0.1f) : std::vector<float>{};
  std::vector<float> out(N * C), mean(N), rstd(N);
  norm_forward(type, view(out, {N, C}), ln ? view(mean, {N}) : Tensor{}, view(rstd, {N}),
               view(x, {N, C}), view(g, {C}), ln ? view(b, {C}) : Tensor{}, scale, 1e-5f);
  expect_close(out, norm_ref(type, to_f64(x), to_f64(g), to_f64(b), scale, 1e-5, N, C), kFwdTol,
               "norm out");

  // Fused residual add: res = alpha*res_in + delta, out = norm(res).
  auto delta = randn(N * C, 6);
  std::vector<float> res(N * C), out2(N * C);
  residual_norm_forward(type, view(res, {N, C}), view(out2, {N, C}), ln ? view(mean, {N}) : Tensor{},
                        view(rstd, {N}), view(x, {N, C}), view(delta, {N, C}), 1.7f, view(g, {C}),
                        ln ? view(b, {C}) : Tensor{}, scale, 1e-5f);
  Vec res_want(N * C);
  for (int64_t i = 0; i < N * C; ++i) res_want[i] = 1.7 * x[i] + double(delta[i]);
  expect_close(res, res_want, kFwdTol, "residual");
  expect_close(out2, norm_ref(type, res_want, to_f64(g), to_f64(b), scale, 1e-5, N, C), kFwdTol,
               "fused norm out");
}

TEST_P(NormOps, BackwardMatchesFiniteDifferences) {
  const auto [type, C, scale] = GetParam();
  const int64_t N = 4;
  const bool ln = type == NormType::LayerNorm;
  auto x = randn(N * C, 7, 1.0f, 0.5f), g = randn(C, 8, 0.3f, 1.0f);
  auto b = ln ? randn(C, 9, 0.1f) : std::vector<float>{};
  auto dout = randn(N * C, 10), dres = randn(N * C, 11);
  std::vector<float> out(N * C), mean(N), rstd(N), dx(N * C), dg(C, 0.5f), db(C, -0.25f);
  norm_forward(type, view(out, {N, C}), ln ? view(mean, {N}) : Tensor{}, view(rstd, {N}),
               view(x, {N, C}), view(g, {C}), ln ? view(b, {C}) : Tensor{}, scale, 1e-5f);
  norm_backward(type, view(dx, {N, C}), view(dg, {C}), ln ? view(db, {C}) : Tensor{},
                view(dres, {N, C}), view(dout, {N, C}), view(x, {N, C}),
                ln ? view(mean, {N}) : Tensor{}, view(rstd, {N}), view(g, {C}), scale);
  const Vec xd = to_f64(x), gd = to_f64(g), bd = to_f64(b), dod = to_f64(dout);
  auto dx_want = fd_grad([&](const Vec& v) { return dot(norm_ref(type, v, gd, bd, scale, 1e-5, N, C), dod); }, xd);
  for (int64_t i = 0; i < N * C; ++i) dx_want[i] += dres[i];  // dx = dres + grad
  auto dg_want = fd_grad([&](const Vec& v) { return dot(norm_ref(type, xd, v, bd, scale, 1e-5, N, C), dod); }, gd);
  for (auto& v : dg_want) v += 0.5;  // accumulated onto the initial 0.5
  expect_close(dx, dx_want, kBwdTol, "dx");
  expect_close(dg, dg_want, kBwdTol, "dgain");
  if (ln) {
    auto db_want = fd_grad([&](const Vec& v) { return dot(norm_ref(type, xd, gd, v, scale, 1e-5, N, C), dod); }, bd);
    for (auto& v : db_want) v -= 0.25;
    expect_close(db, db_want, kBwdTol, "dbias");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, NormOps,
                         ::testing::Values(NormCase{NormType::RMSNorm, 36, 1.0f},
                                           NormCase{NormType::RMSNorm, 45, 0.57735f},
                                           NormCase{NormType::LayerNorm, 36, 1.0f},
                                           NormCase{NormType::LayerNorm, 45, 0.5f}));

// ---- fixed-divisor norms (LN-free) -----------------------------------------------------
TEST_P(NormOps, FixedDivisorForwardBackwardMatchF64) {
  const auto [type, C, scale] = GetParam();
  const int64_t N = 6, T = 3;
  const bool ln = type == NormType::LayerNorm;
  const FixedDivisor fd{2.5f, 0.75f, T};
  auto x = randn(N * C, 21, 1.0f, 0.5f), g = randn(C, 22, 0.3f, 1.0f);
  auto b = ln ? randn(C, 23, 0.1f) : std::vector<float>{};
  auto dout = randn(N * C, 24), dres = randn(N * C, 25);
  std::vector<float> out(N * C), mean(N), rstd(N), dx(N * C), dg(C, 0.5f), db(C, -0.25f);
  norm_forward_fixed(type, view(out, {N, C}), ln ? view(mean, {N}) : Tensor{}, view(rstd, {N}),
                     view(x, {N, C}), view(g, {C}), ln ? view(b, {C}) : Tensor{}, scale, fd);
  const Vec xd = to_f64(x), gd = to_f64(g), bd = to_f64(b), dod = to_f64(dout);
  auto ref = [&](const Vec& xv, const Vec& gv, const Vec& bv) {
    return norm_fixed_ref(type, xv, gv, bv, scale, fd.pos0, fd.rest, T, N, C);
  };
  expect_close(out, ref(xd, gd, bd), kFwdTol, "fixed norm out");
  norm_backward_fixed(type, view(dx, {N, C}), view(dg, {C}), ln ? view(db, {C}) : Tensor{},
                      view(dres, {N, C}), view(dout, {N, C}), view(x, {N, C}),
                      ln ? view(mean, {N}) : Tensor{}, view(rstd, {N}), view(g, {C}), scale);
  auto dx_want = fd_grad([&](const Vec& v) { return dot(ref(v, gd, bd), dod); }, xd);
  for (int64_t i = 0; i < N * C; ++i) dx_want[i] += dres[i];
  auto dg_want = fd_grad([&](const Vec& v) { return dot(ref(xd, v, bd), dod); }, gd);
  for (auto& v : dg_want) v += 0.5;
  expect_close(dx, dx_want, kBwdTol, "fixed dx");
  expect_close(dg, dg_want, kBwdTol, "fixed dgain");
  if (ln) {
    auto db_want = fd_grad([&](const Vec& v) { return dot(ref(xd, gd, v), dod); }, bd);
    for (auto& v : db_want) v -= 0.25;
    expect_close(db, db_want, kBwdTol, "fixed dbias");
  }
}

// Calibration measures exactly the divisor the live norm uses: with the constants set to
// the measured divisors of this very input, the fixed norm equals the normalising one.
TEST_P(NormOps, FixedDivisorAtMeasuredValueEqualsNorm) {
  const auto [type, C, scale] = GetParam();
  const int64_t N = 2, T = 2;  // one sequence: row 0 is position 0, row 1 position 1
  const bool ln = type == NormType::LayerNorm;
  auto x = randn(N * C, 31, 2.0f, 0.7f), g = randn(C, 32, 0.3f, 1.0f);
  auto b = ln ? randn(C, 33, 0.1f) : std::vector<float>{};
  double sums[4] = {0, 0, 0, 0};
  norm_divisor_sums(type, view(x, {N, C}), T, 1e-5f, sums);
  ASSERT_EQ(sums[1], 1.0);
  ASSERT_EQ(sums[3], 1.0);
  // independent f64 measurement of each row's divisor
  for (int64_t n = 0; n < N; ++n) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += ln ? x[n * C + c] / double(C) : 0.0;
    for (int64_t c = 0; c < C; ++c) var += (x[n * C + c] - mean) * (x[n * C + c] - mean) / C;
    EXPECT_NEAR(sums[2 * n], std::sqrt(var + 1e-5), 1e-12 * std::sqrt(var)) << "row " << n;
  }
  std::vector<float> out(N * C), out_fixed(N * C), mean(N), rstd(N);
  norm_forward(type, view(out, {N, C}), ln ? view(mean, {N}) : Tensor{}, view(rstd, {N}),
               view(x, {N, C}), view(g, {C}), ln ? view(b, {C}) : Tensor{}, scale, 1e-5f);
  norm_forward_fixed(type, view(out_fixed, {N, C}), ln ? view(mean, {N}) : Tensor{},
                     view(rstd, {N}), view(x, {N, C}), view(g, {C}), ln ? view(b, {C}) : Tensor{},
                     scale, FixedDivisor{float(sums[0]), float(sums[2]), T});
  expect_close(out_fixed, to_f64(out), kFwdTol, "fixed at measured == norm");
  // ... and a different constant gives a different output (the test can fail)
  norm_forward_fixed(type, view(out_fixed, {N, C}), ln ? view(mean, {N}) : Tensor{},
                     view(rstd, {N}), view(x, {N, C}), view(g, {C}), ln ? view(b, {C}) : Tensor{},
                     scale, FixedDivisor{float(sums[0]) * 1.01f, float(sums[2]), T});
  double diff = 0;
  for (int64_t c = 0; c < C; ++c) diff = std::max(diff, double(std::abs(out_fixed[c] - out[c])));
  EXPECT_GT(diff, 1e-4);
}

// Which rows divide by pos0 when x holds the micro-batch's rows from row0 on (a rank's
// share under --sequence_parallel, starting mid-sequence) with end-of-text rows: the
// rows are listed by hand. Calibration over two shares adds up to the whole.
TEST(Ops, FixedDivisorRowsFromRow0WithEndOfText) {
  const int64_t T = 5, N = 12, C = 6, row0 = 7;  // x: micro-batch rows 7..18
  auto x = randn(N * C, 41, 1.0f, 0.3f), g = randn(C, 42, 0.2f, 1.0f);
  std::vector<int32_t> ids(N, 1);
  ids[1] = ids[6] = 9;  // rows 8 and 13 are end-of-text tokens; rows 10 and 15 at position 0
  std::vector<float> out(N * C), rstd(N);
  norm_forward_fixed(NormType::RMSNorm, view(out, {N, C}), Tensor{}, view(rstd, {N}), view(x, {N, C}),
                     view(g, {C}), Tensor{}, 1.0f, FixedDivisor{0.5f, 2.0f, T, 9, view(ids, {N}), row0});
  for (int64_t n = 0; n < N; ++n)
    EXPECT_EQ(rstd[n], (n == 1 || n == 3 || n == 6 || n == 8) ? 2.0f : 0.5f) << "row " << n;
  norm_forward_fixed(NormType::RMSNorm, view(out, {N, C}), Tensor{}, view(rstd, {N}), view(x, {N, C}),
                     view(g, {C}), Tensor{}, 1.0f, FixedDivisor{0.5f, 2.0f, T, -1, Tensor{}, row0});
  for (int64_t n = 0; n < N; ++n) EXPECT_EQ(rstd[n], (n == 3 || n == 8) ? 2.0f : 0.5f) << "row " << n;
  double whole[4] = {0, 0, 0, 0}, parts[4] = {0, 0, 0, 0};
  norm_divisor_sums(NormType::RMSNorm, view(x, {N, C}), T, 1e-5f, whole, row0);
  EXPECT_EQ(whole[1], 2.0);  // rows 10 and 15 (calibration has no end-of-text case)
  EXPECT_EQ(whole[3], 10.0);
  norm_divisor_sums(NormType::RMSNorm, view(x, {N, C}).rows(0, 4), T, 1e-5f, parts, row0);
  norm_divisor_sums(NormType::RMSNorm, view(x, {N, C}).rows(4, N), T, 1e-5f, parts, row0 + 4);
  for (int k = 0; k < 4; ++k) EXPECT_NEAR(parts[k], whole[k], 1e-12 * whole[k]) << k;
}

TEST(Ops, FixedDivisorRefusesBadInput) {
  std::vector<float> x(6 * 4, 1.0f), g(4, 1.0f), out(6 * 4), rstd(6);
  auto run = [&](FixedDivisor d) {
    norm_forward_fixed(NormType::RMSNorm, view(out, {6, 4}), Tensor{}, view(rstd, {6}),
                       view(x, {6, 4}), view(g, {4}), Tensor{}, 1.0f, d);
  };
  EXPECT_THROW(run(FixedDivisor{0.0f, 1.0f, 3}), UserError);
  EXPECT_THROW(run(FixedDivisor{1.0f, -1.0f, 3}), UserError);
  EXPECT_THROW(run(FixedDivisor{1.0f, std::nanf(""), 3}), UserError);
  EXPECT_NO_THROW(run(FixedDivisor{1.0f, 1.0f, 3}));
}

// ---- linear ---------------------------------------------------------------------------
TEST(Ops, LinearForwardBackward) {
  const int64_t N = 7, in = 36, out = 45;
  auto x = randn(N * in, 12), w = randn(out * in, 13, 0.2f), dy = randn(N * out, 14);
  std::vector<float> y(N * out), dx(N * in, 0.0f), dw(out * in, 1.0f);
  linear_forward(view(y, {N, out}), view(x, {N, in}), view(w, {out, in}));
  expect_close(y, linear_ref(to_f64(x), to_f64(w), N, in, out), kFwdTol, "y");
  linear_backward(view(dx, {N, in}), view(dw, {out, in}), view(dy, {N, out}), view(x, {N, in}),
                  view(w, {out, in}), false);
  const Vec xd = to_f64(x), wd = to_f64(w), dyd = to_f64(dy);
  auto dx_want = fd_grad([&](const Vec& v) { return dot(linear_ref(v, wd, N, in, out), dyd); }, xd);
  auto dw_want = fd_grad([&](const Vec& v) { return dot(linear_ref(xd, v, N, in, out), dyd); }, wd);
  for (auto& v : dw_want) v += 1.0;  // dw accumulates
  expect_close(dx, dx_want, kBwdTol, "dx");
  expect_close(dw, dw_want, kBwdTol, "dw");
  // accumulate_dx adds the same gradient again
  linear_backward(view(dx, {N, in}), view(dw, {out, in}), view(dy, {N, out}), view(x, {N, in}),
                  view(w, {out, in}), true);
  for (auto& v : dx_want) v *= 2;
  expect_close(dx, dx_want, kBwdTol, "dx accumulated");
}

// ---- rope -----------------------------------------------------------------------------
TEST(Ops, RopeForwardBackward) {
  const int64_t B = 2, T = 9, H = 3, D = 10;
  const double theta = 500.0;
  RopeTable table(T, D, theta);
  auto x = randn(B * T * H * D, 15);
  std::vector<float> y = x;
  rope_forward(view(y, {B, T, H, D}), table.cos, table.sin);
  expect_close(y, rope_ref(to_f64(x), B, T, H, D, theta), kFwdTol, "rope");
  auto dy = randn(B * T * H * D, 16);
  std::vector<float> dx = dy;
  rope_backward(view(dx, {B, T, H, D}), table.cos, table.sin);
  auto want = fd_grad([&](const Vec& v) { return dot(rope_ref(v, B, T, H, D, theta), to_f64(dy)); },
                      to_f64(x));
  expect_close(dx, want, kBwdTol, "rope backward");
}

// ---- attention --------------------------------------------------------------------------
TEST(Ops, AttentionGqaForwardBackward) {
  const int64_t B = 2, T = 7, Hq = 6, Hkv = 2, D = 6;
  auto q = randn(B * T * Hq * D, 17), k = randn(B * T * Hkv * D, 18), v = randn(B * T * Hkv * D, 19);
  std::vector<float> out(q.size()), probs(B * Hq * T * T);
  const Shape qs{B, T, Hq, D}, ks{B, T, Hkv, D};
  attention_forward(view(out, qs), view(probs, {B, Hq, T, T}), view(q, qs), view(k, ks), view(v, ks));
  const Vec qd = to_f64(q), kd = to_f64(k), vd = to_f64(v);
  expect_close(out, attention_ref(qd, kd, vd, B, T, Hq, Hkv, D), kFwdTol, "attention out");
  for (int64_t i = 0; i < T; ++i)  // causal: nothing above the diagonal
    for (int64_t j = i + 1; j < T; ++j) ASSERT_EQ(probs[i * T + j], 0.0f);

  auto dout = randn(q.size(), 20);
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  attention_backward(view(dq, qs), view(dk, ks), view(dv, ks), view(dout, qs),
                     view(probs, {B, Hq, T, T}), view(q, qs), view(k, ks), view(v, ks));
  const Vec dod = to_f64(dout);
  auto f = [&](const Vec& qq, const Vec& kk, const Vec& vv) {
    return dot(attention_ref(qq, kk, vv, B, T, Hq, Hkv, D), dod);
  };
  expect_close(dq, fd_grad([&](const Vec& x) { return f(x, kd, vd); }, qd), kBwdTol, "dq");
  expect_close(dk, fd_grad([&](const Vec& x) { return f(qd, x, vd); }, kd), kBwdTol, "dk");
  expect_close(dv, fd_grad([&](const Vec& x) { return f(qd, kd, x); }, vd), kBwdTol, "dv");
}

// ---- swiglu ----------------------------------------------------------------------------
TEST(Ops, SwigluForwardBackward) {
  const int64_t n = 3 * 45;
  auto g = randn(n, 21, 2.0f), u = randn(n, 22), dout = randn(n, 23);
  std::vector<float> out(n), dg(n), du(n);
  swiglu_forward(view(out, {3, 45}), view(g, {3, 45}), view(u, {3, 45}));
  auto ref = [&](const Vec& gg, const Vec& uu) {
    Vec o(n);
    for (int64_t i = 0; i < n; ++i) o[i] = gg[i] / (1 + std::exp(-gg[i])) * uu[i];
    return o;
  };
  expect_close(out, ref(to_f64(g), to_f64(u)), kFwdTol, "swiglu");
  swiglu_backward(view(dg, {3, 45}), view(du, {3, 45}), view(dout, {3, 45}), view(g, {3, 45}),
                  view(u, {3, 45}));
  const Vec gd = to_f64(g), ud = to_f64(u), dod = to_f64(dout);
  expect_close(dg, fd_grad([&](const Vec& x) { return dot(ref(x, ud), dod); }, gd), kBwdTol, "dgate");
  expect_close(du, fd_grad([&](const Vec& x) { return dot(ref(gd, x), dod); }, ud), kBwdTol, "dup");
}

// ---- cross-entropy ------------------------------------------------------------------------
TEST(Ops, CrossEntropyWithIgnoreIndex) {
  const int64_t N = 6, V = 37;
  auto logits = randn(N * V, 24, 3.0f);
  std::vector<int32_t> t = {5, kIgnoreIndex, 36, 0, kIgnoreIndex, 17};
  std::vector<float> losses(N), dl(N * V);
  cross_entropy_forward(view(losses, {N}), view(logits, {N, V}), view(t, {N}));
  double mean = 0;
  for (float l : losses) mean += l;
  mean /= 4;  // four targets are not ignored
  EXPECT_EQ(losses[1], 0.0f);
  EXPECT_EQ(losses[4], 0.0f);
  EXPECT_NEAR(mean, ce_ref(to_f64(logits), t, N, V), 1e-6 * mean);
  cross_entropy_backward(view(dl, {N, V}), view(logits, {N, V}), view(t, {N}), 1.0f / 4);
  auto want = fd_grad([&](const Vec& x) { return ce_ref(x, t, N, V); }, to_f64(logits));
  expect_close(dl, want, kBwdTol, "dlogits");
  for (int64_t j = 0; j < V; ++j) ASSERT_EQ(dl[1 * V + j], 0.0f);  // ignored row
}

// The vocab-parallel forward as the stage runs it over three ranks' column shards (one
// with padding columns past `valid`): each shard's max and sum-exp, the max over the
// shards, each sum rescaled to it and summed; losses against the f64 reference.
TEST(Ops, CrossEntropyShardsCombineToTheWholeRow) {
  const int64_t N = 5, V = 37;
  auto logits = randn(N * V, 25, 3.0f);
  for (int64_t j = 0; j < 12; ++j) logits[0 * V + j] += 40.0f;  // row 0's max in shard 0
  std::vector<int32_t> t = {5, kIgnoreIndex, 36, 0, 20};
  const int64_t bounds[4] = {0, 12, 25, V};
  std::vector<float> gmax(N, -INFINITY), se(N, 0.0f), tl(N, 0.0f);
  std::vector<std::vector<float>> lm(3, std::vector<float>(N)), ls(3, std::vector<float>(N));
  for (int r = 0; r < 3; ++r) {
    const int64_t w = bounds[r + 1] - bounds[r], stored = w + 3;  // 3 padding columns
    std::vector<float> shard(N * stored, 1e4f), tr(N);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < w; ++j) shard[n * stored + j] = logits[n * V + bounds[r] + j];
    vocab_max_sumexp_target(view(lm[r], {N}), view(ls[r], {N}), view(tr, {N}), view(shard, {N, stored}), view(t, {N}),
                            bounds[r], w);
    for (int64_t n = 0; n < N; ++n) gmax[n] = std::max(gmax[n], lm[r][n]), tl[n] += tr[n];
  }
  for (int r = 0; r < 3; ++r) {
    vocab_sumexp_rescale(view(ls[r], {N}), view(lm[r], {N}), view(gmax, {N}));
    for (int64_t n = 0; n < N; ++n) se[n] += ls[r][n];
  }
  std::vector<float> losses(N);
  cross_entropy_combine(view(losses, {N}), view(gmax, {N}), view(se, {N}), view(tl, {N}), view(t, {N}));
  double mean = 0;
  for (float l : losses) mean += l;
  mean /= 4;
  EXPECT_EQ(losses[1], 0.0f);
  EXPECT_NEAR(mean, ce_ref(to_f64(logits), t, N, V), 1e-6 * mean);
}

// ---- learnable residual scale (scale_res_pre_norm) ---------------------------------------
TEST(Ops, ScaledResidualForwardBackward) {
  const int64_t n = 5 * 36;
  auto x = randn(n, 31), f = randn(n, 32), dr = randn(n, 33);
  std::vector<float> alpha = {0.7f}, r(n), dx(n), dalpha = {0.25f};  // dalpha accumulates
  scaled_residual_forward(view(r, {5, 36}), view(x, {5, 36}), view(f, {5, 36}), view(alpha, {1}));
  auto ref = [&](const Vec& xx, double a) {
    Vec o(n);
    for (int64_t i = 0; i < n; ++i) o[i] = a * xx[i] + f[i];
    return o;
  };
  expect_close(r, ref(to_f64(x), 0.7), kFwdTol, "r");
  const Vec xd = to_f64(x), drd = to_f64(dr);
  // dx aliases dr, as in the block: dalpha must be taken before dr is overwritten.
  std::vector<float> dr_inplace = dr;
  scaled_residual_backward(view(dr_inplace, {5, 36}), view(dalpha, {1}), view(dr_inplace, {5, 36}),
                           view(x, {5, 36}), view(alpha, {1}));
  expect_close(dr_inplace, fd_grad([&](const Vec& v) { return dot(ref(v, 0.7), drd); }, xd), kBwdTol, "dx");
  const double da = fd_grad([&](const Vec& a) { return dot(ref(xd, a[0]), drd); }, {0.7})[0];
  EXPECT_NEAR(dalpha[0], 0.25 + da, kBwdTol * std::abs(da)) << "dalpha accumulates";
}

// ---- Gumbel-routed block (routed, mono, mono_reverse) -------------------------------------
// The gate's straight-through gradient is the derivative of L = sum_bk dgate[b,k] *
// soft[b,k](x, w): central differences of that f64 function check dx and dw.
TEST(Ops, RouteGateForwardAndStraightThroughBackward) {
  const int64_t B = 3, T = 4, C = 7;
  auto x = randn(B * T * C, 41), w = randn(2 * C, 42), dg = randn(2 * B, 43);
  std::vector<float> noise = {0.3f, -0.2f, -1.5f, 1.0f, 0.0f, 0.0f};
  auto soft_ref = [&](const Vec& xx, const Vec& ww) {
    Vec s(2 * B);
    for (int64_t b = 0; b < B; ++b) {
      double z[2];
      for (int k = 0; k < 2; ++k) {
        double d = 0;
        for (int64_t t = 0; t < T; ++t)
          for (int64_t c = 0; c < C; ++c) d += xx[(b * T + t) * C + c] * ww[k * C + c];
        z[k] = d / T + noise[b * 2 + k];
      }
      const double e0 = std::exp(z[0]), e1 = std::exp(z[1]);
      s[b * 2] = e0 / (e0 + e1), s[b * 2 + 1] = e1 / (e0 + e1);
    }
    return s;
  };
  std::vector<float> gate(2 * B), soft(2 * B);
  route_gate_forward(view(gate, {B, 2}), view(soft, {B, 2}), view(x, {B, T, C}), view(w, {2, C}),
                     view(noise, {B, 2}));
  const Vec want = soft_ref(to_f64(x), to_f64(w));
  expect_close(soft, want, kFwdTol, "soft");
  for (int64_t b = 0; b < B; ++b) {
    const int pick = want[b * 2 + 1] > want[b * 2] ? 1 : 0;
    EXPECT_EQ(gate[b * 2 + pick], 1.0f) << b;
    EXPECT_EQ(gate[b * 2 + 1 - pick], 0.0f) << b;
  }
  std::vector<float> dx(B * T * C, 0.5f), dw(2 * C, 0.25f);  // both accumulate
  route_gate_backward(view(dx, {B, T, C}), view(dw, {2, C}), view(dg, {B, 2}), view(soft, {B, 2}),
                      view(x, {B, T, C}), view(w, {2, C}));
  const Vec dgd = to_f64(dg);
  Vec wx = fd_grad([&](const Vec& v) { return dot(soft_ref(v, to_f64(w)), dgd); }, to_f64(x));
  Vec ww = fd_grad([&](const Vec& v) { return dot(soft_ref(to_f64(x), v), dgd); }, to_f64(w));
  for (double& v : wx) v += 0.5;
  for (double& v : ww) v += 0.25;
  expect_close(dx, wx, kBwdTol, "dx");
  expect_close(dw, ww, kBwdTol, "dw");
}

TEST(Ops, RouteMixForwardBackward) {
  const int64_t B = 2, T = 3, C = 5, n = B * T * C;
  auto p0 = randn(n, 44), p1 = randn(n, 45), dy = randn(n, 46);
  std::vector<float> gate = {0.0f, 1.0f, 0.7f, 0.3f};  // any weights: the op is bilinear
  auto ref = [&](const Vec& a, const Vec& c, const Vec& g) {
    Vec y(n);
    for (int64_t i = 0; i < n; ++i) y[i] = g[i / (T * C) * 2] * a[i] + g[i / (T * C) * 2 + 1] * c[i];
    return y;
  };
  std::vector<float> y(n), d0(n), d1(n), dgate(2 * B);
  route_mix_forward(view(y, {B, T, C}), view(p0, {B, T, C}), view(p1, {B, T, C}), view(gate, {B, 2}));
  const Vec a = to_f64(p0), c = to_f64(p1), g = to_f64(gate), dyd = to_f64(dy);
  expect_close(y, ref(a, c, g), kFwdTol, "y");
  route_mix_backward(view(d0, {B, T, C}), view(d1, {B, T, C}), view(dgate, {B, 2}), view(dy, {B, T, C}),
                     view(p0, {B, T, C}), view(p1, {B, T, C}), view(gate, {B, 2}));
  expect_close(d0, fd_grad([&](const Vec& v) { return dot(ref(v, c, g), dyd); }, a), kBwdTol, "dp0");
  expect_close(d1, fd_grad([&](const Vec& v) { return dot(ref(a, v, g), dyd); }, c), kBwdTol, "dp1");
  expect_close(dgate, fd_grad([&](const Vec& v) { return dot(ref(a, c, v), dyd); }, g), kBwdTol, "dgate");
}

TEST(Ops, Axpby) {
  std::vector<float> y = {1, 2, 3}, x = {4, 5, 6};
  axpby(view(y, {3}), 2.0f, view(x, {3}), -1.0f);
  EXPECT_EQ(y, (std::vector<float>{-2, -1, 0}));
}

// f32 -> bf16 rounds to nearest even (ties and carries into the exponent), bf16 -> f32
// is exact; the values are written out bit by bit.
TEST(Ops, CastRoundsToNearestEven) {
  std::vector<float> x = {1.0f, 1.00390625f /* 1 + 2^-8: tie, stays 1 */,
                          1.01171875f /* 1 + 3*2^-8: tie, rounds up to even 1 + 2^-6 */, -3.3f,
                          3.4e38f /* 0x7F7FC99E: above the largest bf16 after rounding */};
  std::vector<uint16_t> b(x.size());
  cast(Tensor{b.data(), DType::BF16, Device::CPU, Shape{int64_t(x.size())}}, view(x, {int64_t(x.size())}));
  EXPECT_EQ(b[0], 0x3F80);
  EXPECT_EQ(b[1], 0x3F80);
  EXPECT_EQ(b[2], 0x3F82);
  EXPECT_EQ(b[3], 0xC053);  // -3.3 = -0x1.a66666p+1 -> -0x1.a6p+1
  EXPECT_EQ(b[4], 0x7F80);  // above the largest bf16 (0x7F7F): overflows to +inf
  std::vector<float> back(x.size());
  cast(view(back, {int64_t(x.size())}), Tensor{b.data(), DType::BF16, Device::CPU, Shape{int64_t(x.size())}});
  EXPECT_EQ(back[2], 1.015625f);
  EXPECT_EQ(back[3], -3.296875f);
}

TEST(Ops, AttentionSavesProbabilitiesOnCpuAndLogSumExpOnCuda) {
  EXPECT_EQ(attention_saved_shape(Device::CPU, 2, 5, 3), (Shape{2, 3, 5, 5}));
  EXPECT_EQ(attention_saved_shape(Device::CUDA, 2, 5, 3), (Shape{2, 3, 5}));
}

// ---- the op tables (lns/core/op_table.h) ----------------------------------------------------
// The backends fill them at start-up from registrars that nothing calls, so a program
// must link the backends whole (CMakeLists.txt, `lns`) or the linker drops them: then
// the CPU table would be empty, or a CUDA build would have no CUDA backend.
TEST(OpTable, EveryOpHasAnImplementationOnEveryBuiltDevice) {
  std::set<std::string> on_cpu, on_cuda;
  for (const RegisteredOp& r : registered_ops()) (r.device == Device::CPU ? on_cpu : on_cuda).insert(r.name);
  for (const char* op : {"embedding_forward", "norm_forward", "linear_backward", "attention_backward", "swiglu_forward",
                         "vocab_cross_entropy_backward", "route_mix_backward", "adamw_step", "fp8_cast_weight",
                         "linear_backward_fp8_shared"})
    EXPECT_TRUE(on_cpu.count(op)) << op << " has no CPU implementation";
  EXPECT_NE(OpSlot<&swiglu_forward>::impl[device_index(Device::CPU)], nullptr);
#ifdef LNS_WITH_CUDA
  EXPECT_TRUE(cuda_built()) << "a CUDA build whose CUDA backend did not register";
#endif
  if (cuda_built())
    EXPECT_EQ(on_cuda, on_cpu) << "every op needs both backends";
  else
    EXPECT_TRUE(on_cuda.empty());
}

// A device without a backend: an op on its tensors stops and names the op (the check
// firing, in a build without CUDA given a CUDA tensor).
TEST(OpTable, AnOpWithoutABackendStopsNamingIt) {
  if (cuda_built()) GTEST_SKIP() << "this build has the CUDA backend";
  float x = 1.0f;
  const Tensor t{&x, DType::F32, Device::CUDA, Shape{1}};
  EXPECT_DEATH(scale_inplace(t, 2.0f), "no cuda implementation of scale_inplace is registered");
}

}  // namespace
}  // namespace lns
