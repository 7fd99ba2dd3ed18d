// The OFP8 formats (include/lns/core/fp8_format.h, src/core/fp8_format.cpp) against an independent
// reading of the specification: every one of the 256 codes of each format decoded by
// the formula in double; every finite code encoded back to itself; every midpoint
// between neighbouring codes rounded to the even one and every point just off it to
// the nearer one; the extremes (saturation, overflow, underflow, NaN, signed zero);
// and the scaled cast's statistics on planted values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "lns/core/fp8_format.h"

namespace lns {
namespace {

struct Fmt {
  Fp8Format f;
  int ebits, mbits, bias;
};
constexpr Fmt kFormats[] = {{Fp8Format::E4M3, 4, 3, 7}, {Fp8Format::E5M2, 5, 2, 15}};

// The specification's value of a code, written out independently of fp8.cpp: NaN as NaN,
// infinity as infinity.
double spec_value(uint8_t c, const Fmt& t) {
  const int s = c >> 7, e = (c >> t.mbits) & ((1 << t.ebits) - 1), m = c & ((1 << t.mbits) - 1);
  const int emax = (1 << t.ebits) - 1;
  if (t.f == Fp8Format::E4M3 && e == emax && m == (1 << t.mbits) - 1) return NAN;
  if (t.f == Fp8Format::E5M2 && e == emax) return m == 0 ? (s ? -INFINITY : INFINITY) : NAN;
  const double frac = double(m) / double(1 << t.mbits);
  const double v = e == 0 ? frac * std::pow(2.0, 1 - t.bias) : (1.0 + frac) * std::pow(2.0, e - t.bias);
  return s ? -v : v;
}

TEST(Fp8, EveryCodeDecodesAsTheSpecificationSays) {
  for (const Fmt& t : kFormats)
    for (int c = 0; c < 256; ++c) {
      const double want = spec_value(uint8_t(c), t);
      const float got = fp8_to_f32(uint8_t(c), t.f);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << fp8_format_name(t.f) << " code " << c;
        EXPECT_TRUE(fp8_is_nan(uint8_t(c), t.f));
      } else {
        EXPECT_EQ(double(got), want) << fp8_format_name(t.f) << " code " << c;
        EXPECT_FALSE(fp8_is_nan(uint8_t(c), t.f));
      }
    }
  // the landmarks OFP8 lists
  EXPECT_EQ(fp8_to_f32(0x7E, Fp8Format::E4M3), 448.0f);
  EXPECT_EQ(fp8_to_f32(0x08, Fp8Format::E4M3), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(fp8_to_f32(0x01, Fp8Format::E4M3), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_to_f32(0x7B, Fp8Format::E5M2), 57344.0f);
  EXPECT_EQ(fp8_to_f32(0x04, Fp8Format::E5M2), std::ldexp(1.0f, -14));
  EXPECT_EQ(fp8_to_f32(0x01, Fp8Format::E5M2), std::ldexp(1.0f, -16));
  EXPECT_EQ(fp8_to_f32(0x7C, Fp8Format::E5M2), INFINITY);
  EXPECT_EQ(fp8_max(Fp8Format::E4M3), 448.0f);
  EXPECT_EQ(fp8_max(Fp8Format::E5M2), 57344.0f);
}

// The finite codes of a format with their values, ascending over the non-negative ones.
std::vector<std::pair<uint8_t, double>> positive_codes(const Fmt& t) {
  std::vector<std::pair<uint8_t, double>> out;
  for (int c = 0; c < 128; ++c) {
    const double v = spec_value(uint8_t(c), t);
    if (std::isfinite(v)) out.push_back({uint8_t(c), v});
  }
  return out;
}

TEST(Fp8, EveryFiniteCodeEncodesToItself) {
  for (const Fmt& t : kFormats)
    for (int c = 0; c < 256; ++c) {
      const double v = spec_value(uint8_t(c), t);
      if (!std::isfinite(v)) continue;
      EXPECT_EQ(f32_to_fp8(float(v), t.f), c) << fp8_format_name(t.f) << " " << v;
      EXPECT_EQ(f32_to_fp8(float(v), t.f, false), c);
    }
}

TEST(Fp8, MidpointsRoundToEvenAndNeighboursToTheNearer) {
  for (const Fmt& t : kFormats) {
    const auto codes = positive_codes(t);
    for (size_t i = 0; i + 1 < codes.size(); ++i) {
      const auto [lo, vlo] = codes[i];
      const auto [hi, vhi] = codes[i + 1];
      const float mid = float((vlo + vhi) / 2);  // exact: a few significant bits
      ASSERT_EQ(double(mid), (vlo + vhi) / 2);
      const uint8_t even = (lo & 1) == 0 ? lo : hi;
      EXPECT_EQ(f32_to_fp8(mid, t.f), even) << fp8_format_name(t.f) << " between " << vlo << " and " << vhi;
      EXPECT_EQ(f32_to_fp8(std::nextafter(mid, 0.0f), t.f), lo);
      EXPECT_EQ(f32_to_fp8(std::nextafter(mid, INFINITY), t.f), hi);
      EXPECT_EQ(f32_to_fp8(-mid, t.f), 0x80 | even);  // symmetric
    }
  }
}

TEST(Fp8, ExtremesSaturateOverflowAndUnderflowAsSpecified) {
  const float inf = INFINITY;
  // E4M3: beyond 448 up to the midpoint 464 rounds to 448 (ties to even); past it
  // saturates, or is NaN without saturation; infinity likewise
  EXPECT_EQ(f32_to_fp8(460.0f, Fp8Format::E4M3, false), 0x7E);
  EXPECT_EQ(f32_to_fp8(464.0f, Fp8Format::E4M3, false), 0x7E);
  EXPECT_EQ(f32_to_fp8(465.0f, Fp8Format::E4M3, false), 0x7F);
  EXPECT_EQ(f32_to_fp8(465.0f, Fp8Format::E4M3), 0x7E);
  EXPECT_EQ(f32_to_fp8(-1e30f, Fp8Format::E4M3), 0xFE);
  EXPECT_EQ(f32_to_fp8(inf, Fp8Format::E4M3), 0x7E);
  EXPECT_EQ(f32_to_fp8(-inf, Fp8Format::E4M3, false), 0xFF);
  // E5M2: 57344's mantissa (11) is odd, so the midpoint 61440 already ties away to the
  // even neighbour, 2^16, which is infinity: saturated, or infinity without
  EXPECT_EQ(f32_to_fp8(61439.0f, Fp8Format::E5M2, false), 0x7B);
  EXPECT_EQ(f32_to_fp8(61440.0f, Fp8Format::E5M2, false), 0x7C);
  EXPECT_EQ(f32_to_fp8(61440.0f, Fp8Format::E5M2), 0x7B);
  EXPECT_EQ(f32_to_fp8(61441.0f, Fp8Format::E5M2), 0x7B);
  EXPECT_EQ(f32_to_fp8(-inf, Fp8Format::E5M2, false), 0xFC);
  EXPECT_EQ(f32_to_fp8(-inf, Fp8Format::E5M2), 0xFB);
  // NaN stays NaN
  for (const Fmt& t : kFormats) {
    EXPECT_TRUE(fp8_is_nan(f32_to_fp8(NAN, t.f), t.f));
    EXPECT_TRUE(fp8_is_nan(f32_to_fp8(NAN, t.f, false), t.f));
    // underflow: half the smallest subnormal ties to even (zero), just above it rounds up
    const float tiny = fp8_to_f32(0x01, t.f);
    EXPECT_EQ(f32_to_fp8(tiny / 2, t.f), 0x00);
    EXPECT_EQ(f32_to_fp8(std::nextafter(tiny / 2, 1.0f), t.f), 0x01);
    EXPECT_EQ(f32_to_fp8(-tiny / 4, t.f), 0x80);  // signed zero
    EXPECT_EQ(f32_to_fp8(-0.0f, t.f), 0x80);
    EXPECT_EQ(f32_to_fp8(1e-30f, t.f), 0x00);
  }
}

TEST(Fp8, ScaledCastCountsWhatItClampsAndFlushes) {
  // scale 2: 100 -> 200 (fits E4M3), 300 -> 600 (saturates), 1e-4 -> 2e-4 (below half of
  // 2^-9 = 9.8e-4: flushed), 0 stays 0 (not counted), -3 -> -6, inf (not finite)
  const std::vector<float> x = {100.0f, 300.0f, 1e-4f, 0.0f, -3.0f, INFINITY, -250.0f};
  std::vector<uint8_t> y(x.size());
  const Fp8CastStats st = cast_to_fp8(x.data(), int64_t(x.size()), 2.0f, Fp8Format::E4M3, y.data());
  EXPECT_EQ(st.amax, 300.0f);
  EXPECT_EQ(st.saturated, 2);  // 600 and -500
  EXPECT_EQ(st.flushed, 1);
  EXPECT_EQ(st.nonfinite, 1);
  EXPECT_EQ(fp8_to_f32(y[0], Fp8Format::E4M3), 192.0f);  // 200 rounds to 192 (quantum 16 at 128..256: 192, 208)
  EXPECT_EQ(fp8_to_f32(y[1], Fp8Format::E4M3), 448.0f);
  EXPECT_EQ(y[2], 0x00);
  EXPECT_EQ(fp8_to_f32(y[4], Fp8Format::E4M3), -6.0f);
  EXPECT_EQ(fp8_to_f32(y[5], Fp8Format::E4M3), 448.0f);
  EXPECT_EQ(fp8_to_f32(y[6], Fp8Format::E4M3), -448.0f);
}

// The vectorized cast (whole vectors and the tail) against the element-by-element
// definition: f32_to_fp8's double arithmetic and the health counted with plain branches,
// over 10,007 values that mix every case (both formats, NaN, infinities, values that
// saturate, flush or overflow when scaled) at pseudo-random positions.
TEST(Fp8, VectorizedCastEqualsTheScalarDefinition) {
  uint32_t state = 12345;
  const auto next = [&] { return state = state * 1664525u + 1013904223u; };
  std::vector<float> x(10007);
  for (float& v : x) {
    const uint32_t r = next();
    switch (r % 8) {
      case 0: v = NAN; break;
      case 1: v = (r & 256) ? INFINITY : -INFINITY; break;
      case 2: v = 0.0f; break;
      default: {  // a magnitude 2^-30 .. 2^30 with random mantissa and sign
        const float m = 1.0f + float(next() % 1000) / 1000.0f;
        v = std::ldexp((r & 512) ? -m : m, int(next() % 61) - 30);
      }
    }
  }
  x[17] = 3e38f;  // finite, overflows to infinity when scaled by 4
  for (const Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    const float scale = 4.0f, limit = fp8_max(f);
    std::vector<uint8_t> y(x.size());
    const Fp8CastStats st = cast_to_fp8(x.data(), int64_t(x.size()), scale, f, y.data());
    Fp8CastStats want;
    int64_t wrong = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float v = x[i] * scale;
      const uint8_t c = f32_to_fp8(v, f, true);
      if (fp8_is_nan(c, f) ? !fp8_is_nan(y[i], f) : y[i] != c) ++wrong;
      if (!std::isfinite(x[i])) {
        ++want.nonfinite;
      } else if (std::fabs(x[i]) > want.amax) {
        want.amax = std::fabs(x[i]);
      }
      if (std::isfinite(v) && std::fabs(v) > limit) ++want.saturated;
      if (std::isfinite(v) && v != 0.0f && (c & 0x7F) == 0) ++want.flushed;
    }
    EXPECT_EQ(wrong, 0) << fp8_format_name(f);
    EXPECT_EQ(st.amax, want.amax) << fp8_format_name(f);
    EXPECT_EQ(st.nonfinite, want.nonfinite) << fp8_format_name(f);
    EXPECT_EQ(st.saturated, want.saturated) << fp8_format_name(f);
    EXPECT_EQ(st.flushed, want.flushed) << fp8_format_name(f);
    EXPECT_GT(want.saturated, 100) << fp8_format_name(f);  // every case is there
    EXPECT_GT(want.flushed, 100) << fp8_format_name(f);
    EXPECT_GT(want.nonfinite, 1000) << fp8_format_name(f);
  }
}

}  // namespace
}  // namespace lns

namespace lns {
namespace {

// The kernels' bit-level encoder (fp8_encode_satfinite) is the reference cast: over a
// sweep of every 997th f32 bit pattern (both signs, zeros, subnormals, NaNs, infinities)
// and at each code's value, its rounding midpoints and their f32 neighbours.
TEST(Fp8, TheKernelsEncoderIsTheReferenceCast) {
  for (const Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    int64_t checked = 0, wrong = 0;
    const auto check = [&](float x) {
      ++checked;
      const uint8_t want = f32_to_fp8(x, f, true), got = fp8_encode_satfinite(x, f);
      // NaN inputs: any NaN code is right
      if (got != want && !(fp8_is_nan(got, f) && fp8_is_nan(want, f))) {
        if (++wrong < 5) ADD_FAILURE() << fp8_format_name(f) << " x=" << x << " got " << int(got) << " want " << int(want);
      }
    };
    for (uint64_t b = 0; b <= 0xFFFFFFFFull; b += 997) {
      const uint32_t u = static_cast<uint32_t>(b);
      float x;
      std::memcpy(&x, &u, 4);
      check(x);
    }
    for (int c = 0; c < 128; ++c) {
      const float v = fp8_to_f32(uint8_t(c), f), next = fp8_to_f32(uint8_t(c + 1), f);
      if (!std::isfinite(v)) continue;
      for (const float s : {1.0f, -1.0f}) {
        check(s * v);
        if (std::isfinite(next)) {
          const float mid = 0.5f * (v + next);
          check(s * mid), check(s * std::nextafter(mid, 0.0f)), check(s * std::nextafter(mid, INFINITY));
        }
      }
    }
    EXPECT_EQ(wrong, 0) << fp8_format_name(f) << " over " << checked << " values";
  }
}

}  // namespace
}  // namespace lns
