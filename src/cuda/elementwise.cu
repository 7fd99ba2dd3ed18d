// Elementwise kernels: axpby, f32<->bf16 casts, SwiGLU, RoPE. CPU references:
// src/cpu/elementwise.cpp, swiglu.cpp, rope.cpp. All are memory-bound and grid-stride;
// arithmetic in f32, storage in the tensors' dtypes.
#include "cuda/common.cuh"
#include "cuda/ops_cuda.h"

namespace lns::cuda {
namespace {

constexpr int kBlock = 256;
inline int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>(ceil_div(n, kBlock), 65535L * 16)); }

__device__ __forceinline__ float load_any(const void* p, int64_t i, bool is_bf16) {
  return is_bf16 ? to_f(static_cast<const bf16*>(p)[i]) : static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void store_any(void* p, int64_t i, float v, bool is_bf16) {
  if (is_bf16)
    static_cast<bf16*>(p)[i] = to_bf(v);
  else
    static_cast<float*>(p)[i] = v;
}

// y = a*y + b*x, and cast (a = 0, b = 1, different dtypes): one kernel, dtypes at run time.
__global__ void axpby_kernel(void* y, bool y_bf16, float a, const void* x, bool x_bf16, float b,
                             int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float yv = a == 0.0f ? 0.0f : load_any(y, i, y_bf16);
    store_any(y, i, a * yv + b * load_any(x, i, x_bf16), y_bf16);
  }
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }

// out = silu(gate) * up                                      [N*F]
__global__ void swiglu_forward_kernel(bf16* out, const bf16* gate, const bf16* up, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = to_f(gate[i]);
    out[i] = to_bf(g * sigmoid(g) * to_f(up[i]));
  }
}

// dgate = dout * up * silu'(gate), dup = dout * silu(gate)  [N*F]
__global__ void swiglu_backward_kernel(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate,
                                       const bf16* up, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = to_f(gate[i]), u = to_f(up[i]), d = to_f(dout[i]), s = sigmoid(g);
    dgate[i] = to_bf(d * u * s * (1.0f + g * (1.0f - s)));
    dup[i] = to_bf(d * g * s);
  }
}

// In place on x[B,T,H,D], half-split layout: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s) with
// s multiplied by `sign` (-1 for the backward rotation). One thread per (b,t,h,j), j < D/2.
__global__ void rope_kernel(bf16* x, const float* cos, const float* sin, int64_t BT, int T, int H,
                            int D, float sign) {
  const int half = D / 2;
  const int64_t n = BT * H * half;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int j = i % half;
    const int64_t bth = i / half;  // (b*T + t)*H + h
    const int t = (bth / H) % T;
    bf16* row = x + bth * D;
    const float c = cos[int64_t(t) * half + j], s = sign * sin[int64_t(t) * half + j];
    const float x1 = to_f(row[j]), x2 = to_f(row[j + half]);
    row[j] = to_bf(x1 * c - x2 * s);
    row[j + half] = to_bf(x2 * c + x1 * s);
  }
}

void rope(Tensor x, Tensor cos, Tensor sin, float sign) {
  expect(x, DType::BF16, "rope x");
  expect(cos, DType::F32, "rope cos");
  expect(sin, DType::F32, "rope sin");
  LNS_CHECK(x.shape.ndim == 4);
  const int T = static_cast<int>(x.dim(1)), H = static_cast<int>(x.dim(2)), D = static_cast<int>(x.dim(3));
  LNS_CHECK(D % 2 == 0 && cos.dim(0) >= T && cos.dim(1) == D / 2);
  const int64_t BT = x.dim(0) * T;
  rope_kernel<<<grid_for(BT * H * D / 2), kBlock, 0, stream()>>>(ptr<bf16>(x), ptr<float>(cos),
                                                                 ptr<float>(sin), BT, T, H, D, sign);
  LNS_CUDA_LAUNCHED();
}

}  // namespace

void axpby(Tensor y, float a, Tensor x, float b) {
  LNS_CHECK(y.numel() == x.numel() && y.device == Device::CUDA && x.device == Device::CUDA);
  const int64_t n = y.numel();
  if (n == 0) return;
  axpby_kernel<<<grid_for(n), kBlock, 0, stream()>>>(y.data, y.dtype == DType::BF16, a, x.data,
                                                     x.dtype == DType::BF16, b, n);
  LNS_CUDA_LAUNCHED();
}

void cast(Tensor dst, Tensor src) {
  LNS_CHECK(dst.dtype != DType::I32 && src.dtype != DType::I32);
  cuda::axpby(dst, 0.0f, src, 1.0f);
}

void swiglu_forward(Tensor out, Tensor gate, Tensor up) {
  expect(out, DType::BF16, "swiglu out");
  expect(gate, DType::BF16, "swiglu gate");
  expect(up, DType::BF16, "swiglu up");
  const int64_t n = out.numel();
  LNS_CHECK(gate.numel() == n && up.numel() == n);
  if (n == 0) return;
  swiglu_forward_kernel<<<grid_for(n), kBlock, 0, stream()>>>(ptr<bf16>(out), ptr<bf16>(gate), ptr<bf16>(up), n);
  LNS_CUDA_LAUNCHED();
}

void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) {
  expect(dgate, DType::BF16, "swiglu dgate");
  expect(dup, DType::BF16, "swiglu dup");
  expect(dout, DType::BF16, "swiglu dout");
  expect(gate, DType::BF16, "swiglu gate");
  expect(up, DType::BF16, "swiglu up");
  const int64_t n = dout.numel();
  LNS_CHECK(dgate.numel() == n && dup.numel() == n && gate.numel() == n && up.numel() == n);
  if (n == 0) return;
  swiglu_backward_kernel<<<grid_for(n), kBlock, 0, stream()>>>(ptr<bf16>(dgate), ptr<bf16>(dup), ptr<bf16>(dout),
                                                               ptr<bf16>(gate), ptr<bf16>(up), n);
  LNS_CUDA_LAUNCHED();
}

void rope_forward(Tensor x, Tensor cos, Tensor sin) { rope(x, cos, sin, 1.0f); }
void rope_backward(Tensor dx, Tensor cos, Tensor sin) { rope(dx, cos, sin, -1.0f); }

}  // namespace lns::cuda
