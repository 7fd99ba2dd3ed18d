// OFP8 E4M3 and E5M2 on the host (include/lns/fp8.h). The cast works in double, where
// scaling by a power of two is exact, so rounding to nearest-even is one nearbyint of
// the value in units of its quantum: the integer is the code's magnitude bits directly
// (a carry out of the mantissa lands in the exponent, and the largest subnormal rounds
// up into the smallest normal, with no special case).
#include "lns/fp8.h"

#include <algorithm>
#include <cfenv>
#include <cmath>

namespace lns {
namespace {

struct Spec {
  int mbits, bias;
  uint8_t max_code;   // largest finite magnitude code
  uint8_t overflow;   // the non-saturating result beyond it: NaN (E4M3) or infinity (E5M2)
};
Spec spec(Fp8Format f) {
  return f == Fp8Format::E4M3 ? Spec{3, 7, 0x7E, 0x7F} : Spec{2, 15, 0x7B, 0x7C};
}

}  // namespace

const char* fp8_format_name(Fp8Format f) { return f == Fp8Format::E4M3 ? "e4m3" : "e5m2"; }

float fp8_max(Fp8Format f) { return f == Fp8Format::E4M3 ? 448.0f : 57344.0f; }

bool fp8_is_nan(uint8_t code, Fp8Format f) {
  const uint8_t m = code & 0x7F;
  return f == Fp8Format::E4M3 ? m == 0x7F : m > 0x7C;
}

float fp8_to_f32(uint8_t code, Fp8Format f) {
  const Spec s = spec(f);
  const bool neg = code & 0x80;
  const int e = (code & 0x7F) >> s.mbits, m = code & ((1 << s.mbits) - 1);
  if (fp8_is_nan(code, f)) return std::nanf("");
  if (f == Fp8Format::E5M2 && (code & 0x7F) == 0x7C) return neg ? -INFINITY : INFINITY;
  // subnormal: m x 2^(1 - bias - mbits); normal: (2^mbits + m) x 2^(e - bias - mbits)
  const double v = e == 0 ? std::ldexp(double(m), 1 - s.bias - s.mbits)
                          : std::ldexp(double((1 << s.mbits) + m), e - s.bias - s.mbits);
  return static_cast<float>(neg ? -v : v);
}

uint8_t f32_to_fp8(float x, Fp8Format f, bool saturate) {
  const Spec s = spec(f);
  if (std::isnan(x)) return 0x7F;  // a NaN in both formats
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(double(x));
  if (a == 0.0) return sign;
  if (std::isinf(x)) return sign | (saturate ? s.max_code : s.overflow);
  int k;
  std::frexp(a, &k);  // a = q x 2^k, q in [0.5, 1): the binade's exponent is k - 1
  // the quantum: 2^(k - 1 - mbits) in the normal range, 2^(1 - bias - mbits) below it
  const int qexp = std::max(k - 1, 1 - s.bias) - s.mbits;
  const int saved = std::fegetround();
  std::fesetround(FE_TONEAREST);
  const double n = std::nearbyint(std::ldexp(a, -qexp));  // ties to even
  std::fesetround(saved);
  // the code's magnitude: for a subnormal it is n itself; for a normal value of binade
  // k - 1 it is (k - 1 + bias) << mbits plus n's bits under the leading one
  const double code = k - 1 < 1 - s.bias ? n : std::ldexp(double(k - 1 + s.bias), s.mbits) + (n - std::ldexp(1.0, s.mbits));
  if (code > s.max_code) return sign | (saturate ? s.max_code : s.overflow);
  return sign | static_cast<uint8_t>(code);
}

Fp8CastStats cast_to_fp8(const float* x, int64_t n, float scale, Fp8Format f, uint8_t* y) {
  Fp8CastStats st;
  const double limit = fp8_max(f);
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) {
      ++st.nonfinite;
    } else {
      st.amax = std::max(st.amax, std::fabs(x[i]));
    }
    const float v = x[i] * scale;
    y[i] = fp8_encode_satfinite(v, f);  // = f32_to_fp8(v, f, true) (tested), without f32_to_fp8's double arithmetic
    if (std::isfinite(v) && std::fabs(double(v)) > limit) ++st.saturated;
    if (v != 0.0f && std::isfinite(v) && (y[i] & 0x7F) == 0) ++st.flushed;
  }
  return st;
}

}  // namespace lns
