// bfloat16 as the SIMT emulator provides it (-DLNS_CUDA_SIM=ON): the storage type and
// the conversions src/cuda uses, rounding to nearest even like the GPU's cvt.rn.
#pragma once
#include <cstdint>
#include <cstring>

#include "cuda_runtime.h"

struct __nv_bfloat16 {
  uint16_t __x;
};
typedef __nv_bfloat16 nv_bfloat16;

inline float __bfloat162float(__nv_bfloat16 h) {
  const uint32_t bits = uint32_t(h.__x) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{uint16_t((bits >> 16) | 0x40)};  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return __nv_bfloat16{uint16_t(bits >> 16)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
