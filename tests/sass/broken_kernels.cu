// Deliberately bad kernels for the test that tools/perf/sass_check.py fires
// (ctest sass_check_fires). Never linked into lns. Each one breaks one rule:
//  - spilling_kernel: a per-thread array indexed at run time lives in local memory
//    (LDL/STL: what a register spill costs);
//  - broken_vector_kernel<8>: a "16-byte vector" path that loads 8 bf16 with one
//    128-bit load but stores them one by one (STG.U16), the norm backward bug.
#include <cuda_bf16.h>

#include <cstdint>

namespace lns::cuda::broken {

__global__ void spilling_kernel(float* out, const float* in, const int* idx, int n) {
  float local[64];
  for (int k = 0; k < 64; ++k) local[k] = in[(threadIdx.x + k * blockDim.x) % n];
  out[threadIdx.x] = local[idx[threadIdx.x] & 63];  // dynamic index: local memory
}

struct alignas(16) Vec8 {
  __nv_bfloat16 v[8];
};

// y[i] = 2 * x[i], W = 8 elements a thread
template <int W>
__global__ void broken_vector_kernel(__nv_bfloat16* y, const __nv_bfloat16* x, int64_t n) {
  const int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * W;
  if (i >= n) return;
  const Vec8 v = *reinterpret_cast<const Vec8*>(x + i);  // LDG.128
#pragma unroll
  for (int k = 0; k < W; ++k) y[i + k] = __float2bfloat16(2.0f * __bfloat162float(v.v[k]));  // STG.U16
}
template __global__ void broken_vector_kernel<8>(__nv_bfloat16*, const __nv_bfloat16*, int64_t);

}  // namespace lns::cuda::broken
