// bfloat16 as the SIMT emulator provides it (-DLNS_CUDA_SIM=ON): the storage type and
// the conversions src/cuda uses. The rounding (to nearest even, NaN kept quiet, like
// the GPU's cvt.rn.bf16.f32) is the project's one rule in include/lns/core/bf16.h.
#pragma once
#include <cstdint>

#include "cuda_runtime.h"
#include "lns/core/bf16.h"

struct __nv_bfloat16 {
  uint16_t __x;
};
typedef __nv_bfloat16 nv_bfloat16;

inline float __bfloat162float(__nv_bfloat16 h) { return ::lns::bf16_to_f32(h.__x); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{::lns::f32_to_bf16(f)}; }
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
