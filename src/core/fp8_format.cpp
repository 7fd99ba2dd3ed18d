// OFP8 E4M3 and E5M2 on the host (include/lns/core/fp8_format.h). The cast works in double, where
// scaling by a power of two is exact, so rounding to nearest-even is one nearbyint of
// the value in units of its quantum: the integer is the code's magnitude bits directly
// (a carry out of the mantissa lands in the exponent, and the largest subnormal rounds
// up into the smallest normal, with no special case).
#include "lns/core/fp8_format.h"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <limits>

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

// An AVX2 clone of cast_to_fp8 beside the portable one where the compiler can make them
// (GCC's function multi-versioning, picked at load time; the loops are inlined into each
// clone): the encoder's variable shifts vectorize there, and the CPU FP8 step spends most
// of its extra time in these loops.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define LNS_CAST_CLONES __attribute__((target_clones("avx2", "default")))
#define LNS_CAST_INLINE inline __attribute__((always_inline))
#else
#define LNS_CAST_CLONES
#define LNS_CAST_INLINE inline
#endif

namespace {

// The loops of cast_to_fp8 for one format (a constant, so that the encoder's format
// selects fold away), written so that GCC vectorizes them: the encoding alone in one loop
// (a map), the health in another, counted as 0/1 sums into 32-bit lanes over blocks
// (64-bit and conditional reductions do not vectorize). A NaN fails every comparison,
// and an infinity is not below the f32 infinity.
template <Fp8Format F>
LNS_CAST_INLINE Fp8CastStats cast_loop(const float* x, int64_t n, float scale, uint8_t* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = fp8_encode_satfinite(x[i] * scale, F);  // = f32_to_fp8(.., true), tested
  const float limit = F == Fp8Format::E4M3 ? 448.0f : 57344.0f, inf = std::numeric_limits<float>::infinity();
  // amax as the largest bit pattern: for non-negative floats the bits order as the values
  // do, and an integer max reduction vectorizes where a float one (NaN rules) does not
  uint32_t amax_bits = 0;
  Fp8CastStats st;
  constexpr int64_t kBlock = int64_t{1} << 30;  // 32-bit counts cannot wrap within a block
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    uint32_t nonfinite = 0, saturated = 0, flushed = 0;
    for (int64_t i = b; i < e; ++i) {
      const float a = std::fabs(x[i]), av = std::fabs(x[i] * scale);
      uint32_t bits;
      std::memcpy(&bits, &a, 4);
      const uint32_t finite = a < inf, finite_v = av < inf;
      amax_bits = std::max(amax_bits, bits & (0u - finite));  // a mask, not a select
      nonfinite += 1u - finite;
      saturated += finite_v & static_cast<uint32_t>(av > limit);  // v finite, beyond the largest code
      flushed += finite_v & static_cast<uint32_t>(av > 0.0f) & static_cast<uint32_t>((y[i] & 0x7F) == 0);
    }
    st.nonfinite += nonfinite;
    st.saturated += saturated;
    st.flushed += flushed;
  }
  std::memcpy(&st.amax, &amax_bits, 4);
  return st;
}

}  // namespace

LNS_CAST_CLONES
Fp8CastStats cast_to_fp8(const float* x, int64_t n, float scale, Fp8Format f, uint8_t* y) {
  return f == Fp8Format::E4M3 ? cast_loop<Fp8Format::E4M3>(x, n, scale, y)
                              : cast_loop<Fp8Format::E5M2>(x, n, scale, y);
}

}  // namespace lns
