// The two 8-bit floating-point formats of Hopper's tensor cores, as the OCP 8-bit
// floating point specification (OFP8, v1.0) defines them, and the scaled cast that
// FP8 training applies to a tensor (issue 30). The CPU reference of every FP8 cast: the
// emulator's cuBLASLt stand-in and the CUDA kernels' tests compare against it.
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

}  // namespace lns
