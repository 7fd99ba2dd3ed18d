// The FP8 linear layer's CPU ops (include/lns/fp8_linear.h) against f64 math written out
// here: each operand rounded by the OFP8 cast of lns/fp8.h (itself tested bit for bit in
// test_fp8.cpp), the products summed in double and unscaled; the health counts against
// counts taken independently; and the stage's FP8 state (lns/fp8_state.h) turning a
// step's amax into the next scale, reduced over ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "lns/errors.h"
#include "lns/fp8.h"
#include "lns/fp8_linear.h"
#include "lns/fp8_state.h"
#include "test_util.h"

namespace lns {
namespace {

using namespace lns::test;

// Q(v * s) as a double: what one FP8 operand contributes before unscaling.
double q(float v, float s, Fp8Format f) { return fp8_to_f32(f32_to_fp8(v * s, f), f); }

struct Problem {
  int64_t N = 13, in = 40, out = 24;
  std::vector<float> x = randn(N * in, 1, 3.0f), w = randn(out * in, 2, 0.05f), dy = randn(N * out, 3, 1e-3f);
  // rows 0 x, 1 w, 2 dy of a table with one spare row
  std::vector<float> table = std::vector<float>(4 * kFp8Fields, 0.0f);
  Fp8Linear lin() { return {view(table, {4, kFp8Fields}), 0, 1, 2}; }
  float& at(int64_t row, Fp8Field f) { return table[size_t(row * kFp8Fields + f)]; }
  Problem(float sx, float sw, float sdy) {
    const float s[3] = {sx, sw, sdy};
    for (int r = 0; r < 3; ++r) at(r, kFp8Scale) = s[r], at(r, kFp8ScaleInv) = 1.0f / s[r];
  }
};

TEST(Fp8Linear, ForwardAndBackwardAreTheGemmOfTheRoundedOperands) {
  Problem p(16.0f, 2048.0f, 65536.0f);  // values well inside each format's normal range
  std::vector<float> y(size_t(p.N * p.out)), dx(size_t(p.N * p.in), 0.5f), dw(size_t(p.out * p.in), 0.25f);
  linear_forward_fp8(view(y, {p.N, p.out}), view(p.x, {p.N, p.in}), view(p.w, {p.out, p.in}), p.lin());
  linear_backward_fp8(view(dx, {p.N, p.in}), view(dw, {p.out, p.in}), view(p.dy, {p.N, p.out}),
                      view(p.x, {p.N, p.in}), view(p.w, {p.out, p.in}), /*accumulate_dx=*/true, p.lin());
  const float sx = p.at(0, kFp8Scale), sw = p.at(1, kFp8Scale), sd = p.at(2, kFp8Scale);
  std::vector<double> wy(y.size()), wdx(dx.size(), 0.5), wdw(dw.size(), 0.25);
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t o = 0; o < p.out; ++o)
      for (int64_t i = 0; i < p.in; ++i) {
        const double qx = q(p.x[n * p.in + i], sx, Fp8Format::E4M3), qw = q(p.w[o * p.in + i], sw, Fp8Format::E4M3),
                     qd = q(p.dy[n * p.out + o], sd, Fp8Format::E5M2);
        wy[n * p.out + o] += qx * qw / (double(sx) * sw);
        wdx[n * p.in + i] += qd * qw / (double(sd) * sw);
        wdw[o * p.in + i] += qd * qx / (double(sd) * sx);
      }
  // f32 accumulation of at most 40 exact products: 1e-6 of the largest entry
  expect_close(y, wy, 1e-6, "y");
  expect_close(dx, wdx, 1e-6, "dx");
  expect_close(dw, wdw, 1e-6, "dw");
  // And FP8 is really in it: E4M3's 3 mantissa bits move y by percents from the f32 GEMM.
  double diff = 0, scale = 0;
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t o = 0; o < p.out; ++o) {
      double exact = 0;
      for (int64_t i = 0; i < p.in; ++i) exact += double(p.x[n * p.in + i]) * p.w[o * p.in + i];
      diff = std::max(diff, std::abs(exact - y[n * p.out + o])), scale = std::max(scale, std::abs(exact));
    }
  EXPECT_GT(diff / scale, 1e-3);
  EXPECT_LT(diff / scale, 0.2);

  // Health: amax of the unscaled tensors, every element counted once (x and w in the
  // forward, dy in the backward; the backward's second casts of x and w record nothing).
  const auto amax = [](const std::vector<float>& v) {
    float m = 0;
    for (float a : v) m = std::max(m, std::abs(a));
    return m;
  };
  EXPECT_EQ(p.at(0, kFp8Amax), amax(p.x));
  EXPECT_EQ(p.at(1, kFp8Amax), amax(p.w));
  EXPECT_EQ(p.at(2, kFp8Amax), amax(p.dy));
  EXPECT_EQ(p.at(0, kFp8Elements), p.N * p.in);
  EXPECT_EQ(p.at(1, kFp8Elements), p.out * p.in);
  EXPECT_EQ(p.at(2, kFp8Elements), p.N * p.out);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(p.at(r, kFp8Nonfinite), 0) << r;
  for (int f = 0; f < kFp8Fields; ++f) EXPECT_EQ(p.at(3, Fp8Field(f)), 0.0f) << "the spare row is untouched";
}

// A scale too large for the data saturates (clamped to 448, counted); one too small
// flushes small values to zero (counted); both are the counts taken here by hand.
TEST(Fp8Linear, SaturationAndFlushToZeroAreCounted) {
  for (const float sx : {400.0f, 1.0f / 2048}) {
    Problem p(sx, 1024.0f, 1.0f);
    std::vector<float> y(size_t(p.N * p.out));
    linear_forward_fp8(view(y, {p.N, p.out}), view(p.x, {p.N, p.in}), view(p.w, {p.out, p.in}), p.lin());
    int64_t saturated = 0, flushed = 0;
    std::vector<double> wy(y.size());
    for (float v : p.x) {
      saturated += std::abs(double(v) * sx) > 448.0;
      flushed += v != 0 && q(v, sx, Fp8Format::E4M3) == 0.0;
    }
    for (int64_t n = 0; n < p.N; ++n)
      for (int64_t o = 0; o < p.out; ++o)
        for (int64_t i = 0; i < p.in; ++i)
          wy[n * p.out + o] += q(p.x[n * p.in + i], sx, Fp8Format::E4M3) * q(p.w[o * p.in + i], 1024.0f, Fp8Format::E4M3) /
                               (double(sx) * 1024.0);
    expect_close(y, wy, 1e-6, "y");
    EXPECT_EQ(p.at(0, kFp8Saturated), saturated) << sx;
    EXPECT_EQ(p.at(0, kFp8Flushed), flushed) << sx;
    if (sx > 1) {
      EXPECT_GT(saturated, 100) << "the check must see saturation";
    } else {
      EXPECT_GT(flushed, 20) << "the check must see flushing";
    }
  }
}

// A non-positive scale is a programming error caught before any cast.
TEST(Fp8LinearDeathTest, ANonPositiveScaleIsRefused) {
  Problem p(0.0f, 1.0f, 1.0f);
  std::vector<float> y(size_t(p.N * p.out));
  EXPECT_DEATH(linear_forward_fp8(view(y, {p.N, p.out}), view(p.x, {p.N, p.in}), view(p.w, {p.out, p.in}), p.lin()),
               "scale 0 is not positive");
}

ParamSet two_linears() {
  ParamSet ps;
  ps.add("model.layers.0.self_attn.q_proj.weight", {4, 3}, ParamKind::Q, 0);
  ps.add("model.layers.0.self_attn.k_proj.weight", {4, 3}, ParamKind::K, 0);
  ps.finalize(Device::CPU);
  return ps;
}

// end_step: the step's amax (max over casts) becomes the next scale (448 / amax for
// E4M3, 57344 / amax for E5M2), the counts are cleared, the health keeps what the step
// saw with the scale it used; begin_step drops casts made outside a step.
TEST(Fp8State, TheStepsAmaxBecomesTheNextScale) {
  ParamSet ps = two_linears();
  Fp8ScalingConfig c;
  c.history = 4;
  Fp8State st(ps, {1}, c, Device::CPU);
  ASSERT_EQ(st.rows(), 3);
  EXPECT_FALSE(st.has(0));
  const Fp8Linear f = st.linear(1);
  float* t = f.table.f32();
  EXPECT_EQ(t[kFp8Scale], 1.0f);
  t[f.x * kFp8Fields + kFp8Amax] = 99.0f;  // an evaluation's cast
  st.begin_step();
  EXPECT_EQ(t[f.x * kFp8Fields + kFp8Amax], 0.0f);
  t[f.x * kFp8Fields + kFp8Amax] = 2.0f, t[f.x * kFp8Fields + kFp8Elements] = 10;
  t[f.x * kFp8Fields + kFp8Saturated] = 3;
  t[f.dy * kFp8Fields + kFp8Amax] = 0.5f, t[f.dy * kFp8Fields + kFp8Elements] = 10;
  const std::vector<Fp8Health>& h = st.end_step({});
  EXPECT_EQ(h[0].name, "model.layers.0.self_attn.k_proj.x");
  EXPECT_EQ(h[2].name, "model.layers.0.self_attn.k_proj.dy");
  EXPECT_EQ(h[0].layer, 0);
  EXPECT_EQ(h[2].linear, 0) << "k_proj is the first (only) FP8 linear given for layer 0";
  EXPECT_EQ(h[2].tensor, 2);
  EXPECT_EQ(h[0].amax, 2.0f);
  EXPECT_EQ(h[0].scale, 1.0f);  // the scale the step cast with
  EXPECT_EQ(h[0].saturated, 3);
  EXPECT_EQ(t[f.x * kFp8Fields + kFp8Scale], 224.0f);
  EXPECT_EQ(t[f.w * kFp8Fields + kFp8Scale], 1.0f);  // no cast of w: its scale stays
  EXPECT_EQ(t[f.dy * kFp8Fields + kFp8Scale], 57344.0f / 0.5f);
  EXPECT_EQ(t[f.x * kFp8Fields + kFp8Saturated], 0.0f);
  // The state round trip (checkpoints) and its range checks.
  Fp8State back(ps, {1}, c, Device::CPU);
  back.restore(st.state(), "test");
  EXPECT_EQ(back.linear(1).table.f32()[kFp8Scale], 224.0f);
  std::vector<std::vector<float>> bad = st.state();
  bad.pop_back();
  EXPECT_THROW(back.restore(bad, "test"), UserError);
}

}  // namespace
}  // namespace lns
