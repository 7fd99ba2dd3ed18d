// The FP8 formats: the two 8-bit floating-point formats of Hopper's tensor cores, as the
// OCP 8-bit floating point specification (OFP8, v1.0) defines them, and the scaled cast
// that FP8 training applies to a tensor (issue 30). The CPU reference of every FP8 cast:
// the emulator's cuBLASLt stand-in and the CUDA kernels' tests compare against it. How
// the scale is chosen is the recipe's (lns/core/fp8_recipe.h); what a linear layer does
// with the casts, fp8_linear.h's.
//
//   E4M3: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits. No infinities; S.1111.111 is
//         NaN, so the largest finite value is 1.75 x 2^8 = 448; subnormals down to 2^-9.
//   E5M2: 1 sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like: exponent 31 is
//         infinity (mantissa 0) or NaN; largest finite 1.75 x 2^15 = 57344; subnormals
//         down to 2^-16.
//
// Rounding is to nearest, ties to even. Saturating casts (what PTX's
// cvt.rn.satfinite.{e4m3,e5m2}x2.f32 does, and the only kind the GPU path uses) clamp
// every finite or infinite value beyond the largest finite one to it, keeping the sign;
// non-saturating casts (OFP8's other mode) give NaN (E4M3) or infinity (E5M2) there.
// NaN stays NaN in both.
#pragma once
#include <cstdint>
#include <cstring>

#if !defined(LNS_HOST_DEVICE) && defined(__CUDACC__)
#define LNS_HOST_DEVICE __host__ __device__
#elif !defined(LNS_HOST_DEVICE)
#define LNS_HOST_DEVICE
#endif

namespace lns {

enum class Fp8Format { E4M3, E5M2 };
const char* fp8_format_name(Fp8Format f);  // "e4m3", "e5m2"

float fp8_max(Fp8Format f);                     // 448, 57344
float fp8_to_f32(uint8_t code, Fp8Format f);    // exact; NaN codes give NaN, E5M2's infinities infinity
uint8_t f32_to_fp8(float x, Fp8Format f, bool saturate = true);
bool fp8_is_nan(uint8_t code, Fp8Format f);

// y[i] = fp8(x[i] * scale): what the FP8 GEMMs read (their scale pointers then undo the
// scale). Returns what the health metrics of issue 30 report: the largest |x| (amax, of
// the unscaled input, non-finite values skipped), how many values saturated (|x * scale|
// beyond the largest finite value) and how many non-zero values flushed to zero.
struct Fp8CastStats {
  float amax = 0.0f;
  int64_t saturated = 0, flushed = 0, nonfinite = 0;
};
Fp8CastStats cast_to_fp8(const float* x, int64_t n, float scale, Fp8Format f, uint8_t* y);

// The saturating cast on the bits of an f32, for kernels (host and device, no double
// arithmetic): the same function as f32_to_fp8(x, f, true), which tests check over a
// sweep of f32 values. The magnitude is taken in units of the target's quantum (2^(e -
// mbits), or the subnormal quantum below the smallest normal) by a right shift of the
// f32 significand, rounded to nearest even on the shifted-out bits; the integer is then
// the code's magnitude bits, a carry out of the mantissa landing in the exponent.
LNS_HOST_DEVICE inline uint8_t fp8_encode_satfinite(float x, Fp8Format f) {
  uint32_t u;
#if defined(__CUDA_ARCH__)
  u = __float_as_uint(x);
#else
  std::memcpy(&u, &x, 4);
#endif
  const bool e4m3 = f == Fp8Format::E4M3;
  const int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const uint32_t max_code = e4m3 ? 0x7Eu : 0x7Bu;
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  // No branches but the NaN select, so that a loop of casts vectorizes (AVX2 has the
  // variable shifts): infinity saturates through the clamp like any large value, and an
  // f32 zero or subnormal (biased exponent 0) gets a shift beyond the significand.
  const int e = static_cast<int>(a >> 23) - 127;             // |x| = 1.frac x 2^e
  const int qexp = (e > 1 - bias ? e : 1 - bias) - mbits;     // the target quantum 2^qexp
  const uint32_t sig = (a & 0x7FFFFFu) | 0x800000u;          // |x| = sig x 2^(e - 23)
  const int want = 23 + qexp - e;                            // >= 23 - mbits
  const int shift = want < 31 ? want : 31;  // sig < 2^24: 31 leaves 0 and a remainder under half
  uint32_t n = sig >> shift;
  const uint32_t rem = sig & ((1u << shift) - 1u), half = 1u << (shift - 1);
  n += static_cast<uint32_t>(rem > half) | (static_cast<uint32_t>(rem == half) & n);  // nearest, ties to even
  const uint32_t code = e < 1 - bias ? n : (static_cast<uint32_t>(e + bias) << mbits) + n - (1u << mbits);
  const uint32_t out = sign | (code > max_code ? max_code : code);
  return static_cast<uint8_t>(a > 0x7F800000u ? 0x7Fu : out);  // NaN (a NaN code in both formats)
}

}  // namespace lns
