// Elementwise kernels: axpby, f32<->bf16 casts, SwiGLU, RoPE. CPU references:
// src/cpu/elementwise.cpp, swiglu.cpp, rope.cpp. All are memory-bound and grid-stride;
// arithmetic in f32, storage in the tensors' dtypes.
#include "cuda/common.cuh"
#include "lns/core/ops.h"

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

// r = a*x + f, a read from device memory (a parameter)      r, x, f [n] bf16; alpha [1]
__global__ void scaled_residual_forward_kernel(bf16* r, const bf16* x, const bf16* f, const float* alpha,
                                               int64_t n) {
  const float a = *alpha;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    r[i] = to_bf(a * to_f(x[i]) + to_f(f[i]));
}

// At most; the grid is a function of the length alone, so the partial sums and their
// order are the same every run (deterministic).
constexpr int kResidualBlocks = 256;

// partial[block] = sum over its elements of dr*x (f64); dx = a*dr. dx may alias dr:
// each element is read before it is written, by the same thread.   dx, dr, x [n] bf16
__global__ void scaled_residual_backward_kernel(bf16* dx, double* partial, const bf16* dr, const bf16* x,
                                                const float* alpha, int64_t n) {
  __shared__ double red[kBlock];
  const float a = *alpha;
  double s = 0.0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float d = to_f(dr[i]);
    s += double(d) * to_f(x[i]);
    dx[i] = to_bf(a * d);
  }
  s = block_sum_f64<kBlock>(s, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// *out += sum of partial[0, n) in index order (one thread: n is a few hundred)
__global__ void sum_partials_kernel(float* out, const double* partial, int n) {
  double s = 0.0;
  for (int i = 0; i < n; ++i) s += partial[i];
  *out += static_cast<float>(s);
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }

// Elementwise kernels walk groups of W elements (W = 8: 16-byte vectors, when every
// pointer is 16-byte aligned and n a multiple of 8; W = 1 otherwise).
#define LNS_FOR_GROUPS(i, n, W) \
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * W; i < n; i += int64_t(gridDim.x) * blockDim.x * W)

// y = a*y + b*x on bf16 y, x [n], W elements a thread (16-byte vectors: the residual
// adds and gradient sums of the model); the same arithmetic as axpby_kernel.
template <int W>
__global__ void axpby_bf16_kernel(bf16* y, float a, const bf16* x, float b, int64_t n) {
  LNS_FOR_GROUPS(i, n, W) {
    float yv[W] = {}, xv[W];  // y is not read when a = 0 (it may hold garbage)
    load<W>(x + i, xv);
    if (a != 0.0f) load<W>(y + i, yv);
#pragma unroll
    for (int k = 0; k < W; ++k) yv[k] = a * yv[k] + b * xv[k];
    store<W>(y + i, yv);
  }
}
void launch_axpby_bf16(bf16* y, float a, const bf16* x, float b, int64_t n) {
  LNS_LAUNCH(axpby_bf16_kernel<kVec>, grid_for(n / kVec), kBlock, 0, stream())(y, a, x, b, n);
}

// out = silu(gate) * up                                      [N*F]
template <int W>
__global__ void swiglu_forward_kernel(bf16* out, const bf16* gate, const bf16* up, int64_t n) {
  LNS_FOR_GROUPS(i, n, W) {
    float g[W], u[W];
    load<W>(gate + i, g);
    load<W>(up + i, u);
#pragma unroll
    for (int k = 0; k < W; ++k) g[k] = g[k] * sigmoid(g[k]) * u[k];
    store<W>(out + i, g);
  }
}

// dgate = dout * up * silu'(gate), dup = dout * silu(gate)  [N*F]
template <int W>
__global__ void swiglu_backward_kernel(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate,
                                       const bf16* up, int64_t n) {
  LNS_FOR_GROUPS(i, n, W) {
    float g[W], u[W], d[W], dg[W], du[W];
    load<W>(gate + i, g);
    load<W>(up + i, u);
    load<W>(dout + i, d);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float s = sigmoid(g[k]);
      dg[k] = d[k] * u[k] * s * (1.0f + g[k] * (1.0f - s));
      du[k] = d[k] * g[k] * s;
    }
    store<W>(dgate + i, dg);
    store<W>(dup + i, du);
  }
}

bool all_vec(std::initializer_list<const void*> ptrs, int64_t n) {
  for (const void* p : ptrs)
    if (!vec_ok(p, n)) return false;
  return true;
}

// In place on x[B,T,H,D], half-split layout: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s) with
// s multiplied by `sign` (-1 for the backward rotation). One thread per (b,t,h) and
// group of W pairs j..j+W-1 < D/2.
template <int W>
__global__ void rope_kernel(bf16* x, const float* cos, const float* sin, int64_t BT, int T, int H,
                            int D, float sign) {
  const int half = D / 2;
  LNS_FOR_GROUPS(i, BT * H * half, W) {
    const int j = i % half;
    const int64_t bth = i / half;  // (b*T + t)*H + h
    const int t = (bth / H) % T;
    bf16* row = x + bth * D;
    float x1[W], x2[W];
    load<W>(row + j, x1);
    load<W>(row + j + half, x2);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float c = cos[int64_t(t) * half + j + k], s = sign * sin[int64_t(t) * half + j + k];
      const float a = x1[k], b = x2[k];
      x1[k] = a * c - b * s;
      x2[k] = b * c + a * s;
    }
    store<W>(row + j, x1);
    store<W>(row + j + half, x2);
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
  // vectors need D/2 a multiple of 8 and both halves 16-byte aligned
  const bool vec = (D / 2) % kVec == 0 && vec_ok(x.data, D);
  const int64_t n = BT * H * D / 2;
  if (vec)
    LNS_LAUNCH(rope_kernel<kVec>, grid_for(n / kVec), kBlock, 0, stream())(ptr<bf16>(x), ptr<float>(cos), ptr<float>(sin),
                                                                   BT, T, H, D, sign);
  else
    LNS_LAUNCH(rope_kernel<1>, grid_for(n), kBlock, 0, stream())(ptr<bf16>(x), ptr<float>(cos), ptr<float>(sin), BT, T, H,
                                                         D, sign);
  LNS_CUDA_LAUNCHED();
}

}  // namespace

void axpby(Tensor y, float a, Tensor x, float b) {
  LNS_CHECK(y.numel() == x.numel() && y.device == Device::CUDA && x.device == Device::CUDA);
  const int64_t n = y.numel();
  if (n == 0) return;
  if (y.dtype == DType::BF16 && x.dtype == DType::BF16 && all_vec({y.data, x.data}, n))
    launch_axpby_bf16(ptr<bf16>(y), a, ptr<bf16>(x), b, n);
  else
    LNS_LAUNCH(axpby_kernel, grid_for(n), kBlock, 0, stream())(y.data, y.dtype == DType::BF16, a, x.data,
                                                       x.dtype == DType::BF16, b, n);
  LNS_CUDA_LAUNCHED();
}

void cast(Tensor dst, Tensor src) {
  LNS_CHECK(dst.dtype != DType::I32 && src.dtype != DType::I32);
  cuda::axpby(dst, 0.0f, src, 1.0f);
}

void scaled_residual_forward(Tensor r, Tensor x, Tensor f, Tensor alpha) {
  expect(r, DType::BF16, "scaled_residual r");
  expect(x, DType::BF16, "scaled_residual x");
  expect(f, DType::BF16, "scaled_residual f");
  expect(alpha, DType::F32, "scaled_residual alpha");
  const int64_t n = r.numel();
  LNS_CHECK(x.numel() == n && f.numel() == n && alpha.numel() == 1);
  if (n == 0) return;
  LNS_LAUNCH(scaled_residual_forward_kernel, grid_for(n), kBlock, 0, stream())(ptr<bf16>(r), ptr<bf16>(x), ptr<bf16>(f), ptr<float>(alpha), n);
  LNS_CUDA_LAUNCHED();
}

void scaled_residual_backward(Tensor dx, Tensor dalpha, Tensor dr, Tensor x, Tensor alpha) {
  expect(dx, DType::BF16, "scaled_residual dx");
  expect(dr, DType::BF16, "scaled_residual dr");
  expect(x, DType::BF16, "scaled_residual x");
  expect(alpha, DType::F32, "scaled_residual alpha");
  expect(dalpha, DType::F32, "scaled_residual dalpha");
  const int64_t n = dr.numel();
  LNS_CHECK(dx.numel() == n && x.numel() == n && alpha.numel() == 1 && dalpha.numel() == 1);
  if (n == 0) return;
  auto* partial = static_cast<double*>(scratch(Scratch::Reduce, sizeof(double) * kResidualBlocks));
  const int blocks = static_cast<int>(std::min<int64_t>(ceil_div(n, kBlock), kResidualBlocks));
  LNS_LAUNCH(scaled_residual_backward_kernel, blocks, kBlock, 0, stream())(ptr<bf16>(dx), partial, ptr<bf16>(dr), ptr<bf16>(x), ptr<float>(alpha), n);
  LNS_CUDA_LAUNCHED();
  LNS_LAUNCH(sum_partials_kernel, 1, 1, 0, stream())(ptr<float>(dalpha), partial, blocks);
  LNS_CUDA_LAUNCHED();
}

void swiglu_forward(Tensor out, Tensor gate, Tensor up) {
  expect(out, DType::BF16, "swiglu out");
  expect(gate, DType::BF16, "swiglu gate");
  expect(up, DType::BF16, "swiglu up");
  const int64_t n = out.numel();
  LNS_CHECK(gate.numel() == n && up.numel() == n);
  if (n == 0) return;
  if (all_vec({out.data, gate.data, up.data}, n))
    LNS_LAUNCH(swiglu_forward_kernel<kVec>, grid_for(n / kVec), kBlock, 0, stream())(ptr<bf16>(out), ptr<bf16>(gate),
                                                                             ptr<bf16>(up), n);
  else
    LNS_LAUNCH(swiglu_forward_kernel<1>, grid_for(n), kBlock, 0, stream())(ptr<bf16>(out), ptr<bf16>(gate), ptr<bf16>(up), n);
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
  if (all_vec({dgate.data, dup.data, dout.data, gate.data, up.data}, n))
    LNS_LAUNCH(swiglu_backward_kernel<kVec>, grid_for(n / kVec), kBlock, 0, stream())(
        ptr<bf16>(dgate), ptr<bf16>(dup), ptr<bf16>(dout), ptr<bf16>(gate), ptr<bf16>(up), n);
  else
    LNS_LAUNCH(swiglu_backward_kernel<1>, grid_for(n), kBlock, 0, stream())(ptr<bf16>(dgate), ptr<bf16>(dup),
                                                                    ptr<bf16>(dout), ptr<bf16>(gate), ptr<bf16>(up), n);
  LNS_CUDA_LAUNCHED();
}

void rope_forward(Tensor x, Tensor cos, Tensor sin) { rope(x, cos, sin, 1.0f); }
void rope_backward(Tensor dx, Tensor cos, Tensor sin) { rope(dx, cos, sin, -1.0f); }

// This file's ops on CUDA (lns/core/op_table.h).
LNS_REGISTER_OPS(Device::CUDA) {
  LNS_REGISTER_OP(axpby, cuda::axpby);
  LNS_REGISTER_OP(cast, cuda::cast);
  LNS_REGISTER_OP(scaled_residual_forward, cuda::scaled_residual_forward);
  LNS_REGISTER_OP(scaled_residual_backward, cuda::scaled_residual_backward);
  LNS_REGISTER_OP(swiglu_forward, cuda::swiglu_forward);
  LNS_REGISTER_OP(swiglu_backward, cuda::swiglu_backward);
  LNS_REGISTER_OP(rope_forward, cuda::rope_forward);
  LNS_REGISTER_OP(rope_backward, cuda::rope_backward);
}

}  // namespace lns::cuda
