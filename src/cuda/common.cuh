// Shared device helpers of the CUDA kernels: bf16 <-> f32, 16-byte vectors of 8 bf16,
// deterministic block reductions, launch arithmetic.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/launch.h"
#include "cuda/runtime.h"
#include "lns/core/errors.h"
#include "lns/core/tensor.h"

namespace lns::cuda {

using bf16 = __nv_bfloat16;

// Host-side checks that a tensor is what a kernel expects.
inline void expect(const Tensor& t, DType dt, const char* what) {
  LNS_CHECK(t.device == Device::CUDA) << what << ": not a CUDA tensor";
  LNS_CHECK(t.dtype == dt) << what << ": " << dtype_name(t.dtype) << ", expected " << dtype_name(dt);
}
template <typename T>
T* ptr(const Tensor& t) { return static_cast<T*>(t.data); }

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// 8 bf16 in 16 bytes: the unit of the vectorized paths. A row can use it when its
// length is a multiple of 8 and its start is 16-byte aligned.
constexpr int kVec = 8;
struct alignas(16) Bf16x8 {
  bf16 v[kVec];
};
inline bool vec_ok(const void* p, int64_t row_len) {
  return row_len % kVec == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ bf16 to_bf(float x) { return __float2bfloat16_rn(x); }

// W consecutive bf16 as f32: one 16-byte load (W = 8, the pointer 16-byte aligned) or
// one scalar (W = 1, the fallback for odd sizes and misaligned views).
template <int W>
__device__ __forceinline__ void load(const bf16* p, float* f) {
  if constexpr (W == kVec) {
    const Bf16x8 v = *reinterpret_cast<const Bf16x8*>(p);
#pragma unroll
    for (int k = 0; k < W; ++k) f[k] = to_f(v.v[k]);
  } else {
    f[0] = to_f(*p);
  }
}
template <int W>
__device__ __forceinline__ void store(bf16* p, const float* f) {
  if constexpr (W == kVec) {
    Bf16x8 v;
#pragma unroll
    for (int k = 0; k < W; ++k) v.v[k] = to_bf(f[k]);
    *reinterpret_cast<Bf16x8*>(p) = v;
  } else {
    *p = to_bf(f[0]);
  }
}

// Sum over the block in a fixed order (warp shuffles, then warp 0 over the warp
// partials): the same inputs give the same bits on every run. blockDim.x must be a
// multiple of 32; `shared` holds 32 floats. Every thread gets the total.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0.0f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

// Sum over a block of N threads (blockDim.x == N, a power of 2) in f64 and a fixed
// order: a halving tree over `red` [N] doubles in shared memory. For sums of many
// small terms whose partials the host adds in order (the gradient norm, a learned
// residual scale's gradient). Every thread gets the total.
template <int N>
__device__ __forceinline__ double block_sum_f64(double v, double* red) {
  static_assert(N > 0 && (N & (N - 1)) == 0, "block_sum_f64: N must be a power of 2");
  red[threadIdx.x] = v;
  __syncthreads();
  for (int w = N / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  return red[0];
}

}  // namespace lns::cuda
