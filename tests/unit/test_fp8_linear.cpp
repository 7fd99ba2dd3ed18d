// The FP8 linear layer's CPU ops (include/lns/core/fp8_linear.h) against f64 math written out
// here: each operand rounded by the OFP8 cast of lns/core/fp8_format.h (itself tested bit for bit in
// test_fp8.cpp), the products summed in double and unscaled; the health counts against
// counts taken independently; and the stage's FP8 state (lns/model/fp8_state.h) turning a
// step's amax into the next scale, reduced over ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "lns/core/errors.h"
#include "lns/core/fp8_format.h"
#include "lns/core/fp8_linear.h"
#include "lns/model/fp8_state.h"
#include "fp8_sharing.h"
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

// --fp8=blockwise's scale: the largest power of two s with amax s <= max, found here by
// walking the exponents; 1 for 0, infinity and NaN.
TEST(Fp8Blockwise, TileScaleIsTheLargestPowerOfTwoThatFits) {
  for (const Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    int checked = 0;
    for (float amax = 1e-30f; amax < 1e30f; amax *= 1.37f) {
      double want = 0;
      for (int e = -126; e <= 127; ++e)
        if (double(amax) * std::ldexp(1.0, e) <= fp8_max(f)) want = std::ldexp(1.0, e);
      EXPECT_EQ(fp8_pow2_scale(amax, f), float(want)) << amax;
      ++checked;
    }
    EXPECT_GT(checked, 400);
    EXPECT_EQ(fp8_pow2_scale(fp8_max(f), f), 1.0f);
    EXPECT_EQ(fp8_pow2_scale(std::nextafter(fp8_max(f), 1e9f), f), 0.5f);
    EXPECT_EQ(fp8_pow2_scale(0.0f, f), 1.0f);
    EXPECT_EQ(fp8_pow2_scale(INFINITY, f), 1.0f);
    EXPECT_EQ(fp8_pow2_scale(NAN, f), 1.0f);
  }
}

// t[R,C] cast tile by tile as written out here: each tile's amax, its scale by walking
// exponents, each value rounded by the reference cast and divided by the scale (f64).
std::vector<double> tiled(const std::vector<float>& t, int64_t R, int64_t C, int64_t tr, int64_t tc, Fp8Format f,
                          int64_t* flushed = nullptr) {
  std::vector<double> out(t.size());
  for (int64_t r0 = 0; r0 < R; r0 += tr)
    for (int64_t c0 = 0; c0 < C; c0 += tc) {
      double amax = 0;
      for (int64_t r = r0; r < std::min(R, r0 + tr); ++r)
        for (int64_t c = c0; c < std::min(C, c0 + tc); ++c) amax = std::max(amax, std::abs(double(t[r * C + c])));
      double s = 1;
      if (amax > 0) {
        s = std::ldexp(1.0, -126);
        while (amax * s * 2 <= fp8_max(f) && s < std::ldexp(1.0, 127)) s *= 2;
      }
      for (int64_t r = r0; r < std::min(R, r0 + tr); ++r)
        for (int64_t c = c0; c < std::min(C, c0 + tc); ++c) {
          const double v = q(t[r * C + c], float(s), f);
          if (flushed && t[r * C + c] != 0 && v == 0) ++*flushed;
          out[r * C + c] = v / s;
        }
    }
  return out;
}

// The blockwise ops against the tile-by-tile definition: x in 1 x 128 tiles along in, w
// in 128 x 128, dy in 1 x 128 along out for dx and 128 x 1 along N for dw (x too),
// products summed in f64. Shapes cross tile edges (in 200, out 136, N 130), and every
// row of x has its own magnitude (10^-1 .. 10^1, and an outlier row), which per-tensor scaling cannot
// follow: there the small rows flush, here they keep their bits.
TEST(Fp8Blockwise, OpsAreTheGemmsOfTheTileScaledOperands) {
  const int64_t N = 130, in = 200, out = 136;
  std::vector<float> x = randn(N * in, 4, 1.0f), w = randn(out * in, 5, 0.05f), dy = randn(N * out, 6, 1e-3f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < in; ++i) x[n * in + i] *= std::pow(10.0f, float(n % 9 - 4) / 4.0f) * (1.0f + float(i % 3));
  // Outliers that make the tiles' directions matter (a power-of-two scale rounds alike
  // wherever values stay normal): row 5 of x and row 7 of dy, each beside a zero row of
  // the other, flush the rest of their 128 x 1 tiles in dw's casts but not in the 1 x 128
  // ones; w[3][3] flushes the rest of its 128 x 128 tile but not of a 1 x 128 one.
  for (int64_t i = 0; i < in; ++i) x[5 * in + i] = 1e5f, x[7 * in + i] = 0.0f;
  for (int64_t o = 0; o < out; ++o) dy[7 * out + o] = 1e6f, dy[5 * out + o] = 0.0f;
  w[3 * in + 3] = 1e4f;
  std::vector<float> table(3 * kFp8Fields, 0.0f);
  for (int r = 0; r < 3; ++r) table[size_t(r * kFp8Fields + kFp8Scale)] = table[size_t(r * kFp8Fields + kFp8ScaleInv)] = 1;
  const Fp8Linear f{view(table, {3, kFp8Fields}), 0, 1, 2, /*blockwise=*/true};
  std::vector<float> y(size_t(N * out)), dx(size_t(N * in), 0.5f), dw(size_t(out * in), 0.25f);
  linear_forward_fp8(view(y, {N, out}), view(x, {N, in}), view(w, {out, in}), f);
  linear_backward_fp8(view(dx, {N, in}), view(dw, {out, in}), view(dy, {N, out}), view(x, {N, in}), view(w, {out, in}),
                      /*accumulate_dx=*/true, f);
  int64_t flushed_x = 0, flushed_dy = 0;
  const std::vector<double> qx = tiled(x, N, in, 1, 128, Fp8Format::E4M3, &flushed_x),
                            qw = tiled(w, out, in, 128, 128, Fp8Format::E4M3),
                            qd = tiled(dy, N, out, 1, 128, Fp8Format::E5M2, &flushed_dy),
                            cd = tiled(dy, N, out, 128, 1, Fp8Format::E5M2), cx = tiled(x, N, in, 128, 1, Fp8Format::E4M3);
  std::vector<double> wy(y.size()), wdx(dx.size(), 0.5), wdw(dw.size(), 0.25);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        wy[n * out + o] += qx[n * in + i] * qw[o * in + i];
        wdx[n * in + i] += qd[n * out + o] * qw[o * in + i];
        wdw[o * in + i] += cd[n * out + o] * cx[n * in + i];
      }
  for (int64_t n = 0; n < N; ++n) {  // the rows differ by 10^7: each to its own largest value
    std::vector<float> row(y.begin() + n * out, y.begin() + (n + 1) * out);
    std::vector<double> want(wy.begin() + n * out, wy.begin() + (n + 1) * out);
    expect_close(row, want, 1e-5, "y row");
    std::vector<float> drow(dx.begin() + n * in, dx.begin() + (n + 1) * in);
    std::vector<double> dwant(wdx.begin() + n * in, wdx.begin() + (n + 1) * in);
    expect_close(drow, dwant, 1e-5, "dx row");
  }
  expect_close(dw, wdw, 1e-5, "dw");
  // health: the forward's x and w casts and the backward's first cast of dy, nothing
  // saturates (each tile's largest value fits by construction)
  EXPECT_EQ(table[0 * kFp8Fields + kFp8Elements], N * in);
  EXPECT_EQ(table[1 * kFp8Fields + kFp8Elements], out * in);
  EXPECT_EQ(table[2 * kFp8Fields + kFp8Elements], N * out);
  EXPECT_EQ(table[0 * kFp8Fields + kFp8Flushed], flushed_x);
  EXPECT_EQ(table[2 * kFp8Fields + kFp8Flushed], flushed_dy);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(table[size_t(r * kFp8Fields + kFp8Saturated)], 0.0f) << r;
  float amax_want = 0;
  for (float v : x) amax_want = std::max(amax_want, std::abs(v));
  EXPECT_EQ(table[0 * kFp8Fields + kFp8Amax], amax_want);
  // per-tensor scaling of the same x, at the scale its amax gives, flushes the small rows
  int64_t flushed_tensor = 0;
  const float amax_x = table[0 * kFp8Fields + kFp8Amax], s = 448.0f / amax_x;
  for (float v : x) flushed_tensor += v != 0 && q(v, s, Fp8Format::E4M3) == 0.0;
  EXPECT_GT(flushed_tensor, N * in / 5) << "per-tensor scaling must lose the small rows here";
  EXPECT_EQ(flushed_x, 0) << "1 x 128 tiles keep them";
  EXPECT_GT(flushed_tensor, flushed_x);
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
  Fp8State st(ps, {1}, Fp8Mode::Delayed, c, Device::CPU);
  ASSERT_EQ(st.rows(), 3);
  EXPECT_FALSE(st.has(0));
  const Fp8Linear f = st.linear(1);
  float* t = f.table.f32();
  EXPECT_EQ(t[kFp8Scale], 1.0f);
  t[f.x * kFp8Fields + kFp8Amax] = 99.0f;  // an evaluation's cast
  st.begin_step();
  EXPECT_EQ(t[f.x * kFp8Fields + kFp8Amax], 0.0f);
  EXPECT_EQ(t[f.w * kFp8Fields + kFp8Elements], 12.0f) << "begin_step casts w (4 x 3) once for the step";
  EXPECT_EQ(st.linear(1).w_cast.numel(), 12);
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
  EXPECT_EQ(t[f.w * kFp8Fields + kFp8Scale], 1.0f);  // w is all zeros: amax 0 keeps the scale
  EXPECT_TRUE(st.linear(1).w_cast.empty()) << "end_step drops the step casts";
  EXPECT_EQ(t[f.dy * kFp8Fields + kFp8Scale], 57344.0f / 0.5f);
  EXPECT_EQ(t[f.x * kFp8Fields + kFp8Saturated], 0.0f);
  // The state round trip (checkpoints) and its range checks.
  Fp8State back(ps, {1}, Fp8Mode::Delayed, c, Device::CPU);
  back.restore(st.state(), "test");
  EXPECT_EQ(back.linear(1).table.f32()[kFp8Scale], 224.0f);
  std::vector<std::vector<float>> bad = st.state();
  bad.pop_back();
  EXPECT_THROW(back.restore(bad, "test"), UserError);
}

// The ops read a weight's step cast (fp8_cast_weight) in place of w, in both modes:
// with it, y, dx and dw are those of the per-call casts bit for bit, w's health is
// recorded by the step cast alone, and a w changed after the cast is not seen (why
// Fp8State::begin_step casts again every step).
TEST(Fp8Linear, OpsReadTheWeightsStepCast) {
  for (const bool blockwise : {false, true}) {
    Problem p(16.0f, 2048.0f, 65536.0f), q(16.0f, 2048.0f, 65536.0f);
    Fp8Linear fp = p.lin(), fq = q.lin();
    fp.blockwise = fq.blockwise = blockwise;
    std::vector<float> wc(size_t(fp8_weight_cast_numel(view(p.w, {p.out, p.in}), fq)));
    fp8_cast_weight(view(wc, {int64_t(wc.size())}), view(q.w, {q.out, q.in}), fq);
    EXPECT_EQ(q.at(1, kFp8Elements), q.out * q.in) << "the step cast records w";
    fq.w_cast = view(wc, {int64_t(wc.size())});
    const std::vector<float> w0 = q.w;
    for (float& v : q.w) v = -v;  // the step cast was made before: not seen
    std::vector<float> yp(size_t(p.N * p.out)), yq(yp.size()), dxp(size_t(p.N * p.in)), dxq(dxp.size());
    std::vector<float> dwp(size_t(p.out * p.in)), dwq(dwp.size());
    linear_forward_fp8(view(yp, {p.N, p.out}), view(p.x, {p.N, p.in}), view(p.w, {p.out, p.in}), fp);
    linear_forward_fp8(view(yq, {q.N, q.out}), view(q.x, {q.N, q.in}), view(q.w, {q.out, q.in}), fq);
    linear_backward_fp8(view(dxp, {p.N, p.in}), view(dwp, {p.out, p.in}), view(p.dy, {p.N, p.out}),
                        view(p.x, {p.N, p.in}), view(p.w, {p.out, p.in}), false, fp);
    linear_backward_fp8(view(dxq, {q.N, q.in}), view(dwq, {q.out, q.in}), view(q.dy, {q.N, q.out}),
                        view(q.x, {q.N, q.in}), view(q.w, {q.out, q.in}), false, fq);
    EXPECT_EQ(yp, yq) << blockwise;
    EXPECT_EQ(dxp, dxq) << blockwise;
    EXPECT_EQ(dwp, dwq) << blockwise;
    EXPECT_EQ(p.table, q.table) << "the same health: w once (the forward's cast or the step cast)";
    // Without the step cast the negated w is what the ops read.
    fq.w_cast = Tensor{};
    std::vector<float> yn(yp.size());
    linear_forward_fp8(view(yn, {q.N, q.out}), view(q.x, {q.N, q.in}), view(q.w, {q.out, q.in}), fq);
    EXPECT_NE(yn, yp) << blockwise;
    q.w = w0;
  }
}

// The shared ops (one cast of x for q, k and v) against the one-linear ops, both modes
// (tests/common/fp8_sharing.h).
TEST(Fp8Linear, SharedInputIsTheSingleOps) {
  for (const bool blockwise : {false, true}) {
    SCOPED_TRACE(blockwise ? "blockwise" : "delayed");
    expect_shared_input_is_the_single_ops(Device::CPU, blockwise);
  }
}

// Linears given one x row must name the same row of the same table in the same mode.
TEST(Fp8LinearDeathTest, SharedLinearsMustCastXAlike) {
  std::vector<float> t(4 * kFp8Fields, 0.0f);
  const Tensor table = view(t, {4, kFp8Fields});
  EXPECT_DEATH(check_fp8_shared(2, 2, {{table, 0, 1, 2}, {table, 3, 1, 2}}), "must cast x alike: x rows 0 and 3");
  EXPECT_DEATH(check_fp8_shared(2, 2, {{table, 0, 1, 2}, {table, 0, 1, 2, true}}), "must cast x alike");
  EXPECT_DEATH(check_fp8_shared(1, 2, {{table, 0, 1, 2}, {table, 0, 1, 2}}), "1 outputs, 2 weights");
}

// A group that reads one input (x_from): every linear of it gets the first's x row, the
// others' x rows report that row's health and follow its scale; split_input (LN-free's
// own v input) gives a linear its own row back.
TEST(Fp8State, AGroupReadingOneInputSharesItsXRow) {
  ParamSet ps = two_linears();
  Fp8State st(ps, {0, 1}, Fp8Mode::Delayed, Fp8ScalingConfig{}, Device::CPU, {0, 0});
  const Fp8Linear q = st.linear(0), k = st.linear(1);
  EXPECT_EQ(k.x, q.x);
  EXPECT_NE(k.w, q.w);
  float* t = q.table.f32();
  t[q.x * kFp8Fields + kFp8Amax] = 4.0f, t[q.x * kFp8Fields + kFp8Elements] = 10, t[q.x * kFp8Fields + kFp8Flushed] = 2;
  const std::vector<Fp8Health> h = st.end_step({});
  EXPECT_EQ(h[3].name, "model.layers.0.self_attn.k_proj.x");
  EXPECT_EQ(h[3].amax, 4.0f);
  EXPECT_EQ(h[3].elements, 10);
  EXPECT_EQ(h[3].flushed, 2);
  EXPECT_EQ(t[3 * kFp8Fields + kFp8Scale], 112.0f) << "k.x follows q.x: 448 / 4";
  st.split_input(1);
  EXPECT_EQ(st.linear(1).x, 3);
  EXPECT_EQ(t[st.linear(1).x * kFp8Fields + kFp8Scale], 112.0f) << "with the group's scale";
  EXPECT_DEATH(Fp8State(ps, {0, 1}, Fp8Mode::Delayed, Fp8ScalingConfig{}, Device::CPU, {1, 1}),
               "x_from 1 for weight 0 is not an earlier FP8 weight");
}

// A stage's two steps with step casts against per-call casts (tests/common/fp8_sharing.h).
TEST(Fp8State, StepCastsAreThePerCallCasts) {
  for (const Fp8Mode m : {Fp8Mode::Delayed, Fp8Mode::Blockwise}) {
    LlamaConfig c = small_model(NormScheme::LNS);
    c.fp8 = m;
    SCOPED_TRACE(fp8_mode_name(m));
    expect_step_casts_are_per_call_casts(c, Device::CPU);
  }
}

}  // namespace
}  // namespace lns
