// AdamW over flat f32 buffers (master weights, moments) writing the bf16 compute copy
// in the same pass, the deterministic sum of squares for the gradient norm, and
// in-place scaling. CPU reference: src/cpu/optimizer_kernels.cpp.
#include "cuda/common.cuh"
#include "lns/core/ops.h"

namespace lns::cuda {
namespace {

constexpr int kBlock = 256;
// At most; the count is a function of the length alone, so the reduction order does
// not depend on the GPU. 1024 x 256 threads fill an H100's 132 SMs (256 blocks left
// them at 25% occupancy); a short range (a norm's gains) needs a block or a few, not
// 1024 mostly idle ones (which the emulator runs thread by thread).
constexpr int kSumBlocks = 1024;

// One element's update (the CPU's formula, operation for operation).
__device__ __forceinline__ void adamw_one(float& p, float g, float& m, float& v, const AdamWHyper& h, float decay) {
  m = h.beta1 * m + (1.0f - h.beta1) * g;
  v = h.beta2 * v + (1.0f - h.beta2) * g * g;
  p = p * decay - h.lr * (m / h.bias_correction1) / (sqrtf(v / h.bias_correction2) + h.eps);
}

// p, g, m, v [n] f32; pc [n] bf16 or null. W = 4 elements a thread (16-byte loads and
// stores, 8 bytes of pc) when n % 4 == 0 and every buffer is aligned for it, else W = 1:
// a step reads and writes every parameter's 30 bytes once, so the width of the accesses
// sets its speed.
struct alignas(8) Bf16x4 {
  bf16 v[4];
};
template <int W>
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, bf16* pc, AdamWHyper h, int64_t n) {
  const float decay = 1.0f - h.lr * h.weight_decay;
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * W; i < n;
       i += int64_t(gridDim.x) * blockDim.x * W) {
    if constexpr (W == 4) {
      float4 pi = *reinterpret_cast<const float4*>(p + i), mi = *reinterpret_cast<const float4*>(m + i),
             vi = *reinterpret_cast<const float4*>(v + i);
      const float4 gi = *reinterpret_cast<const float4*>(g + i);
      adamw_one(pi.x, gi.x, mi.x, vi.x, h, decay);
      adamw_one(pi.y, gi.y, mi.y, vi.y, h, decay);
      adamw_one(pi.z, gi.z, mi.z, vi.z, h, decay);
      adamw_one(pi.w, gi.w, mi.w, vi.w, h, decay);
      *reinterpret_cast<float4*>(p + i) = pi, *reinterpret_cast<float4*>(m + i) = mi;
      *reinterpret_cast<float4*>(v + i) = vi;
      if (pc) *reinterpret_cast<Bf16x4*>(pc + i) = Bf16x4{{to_bf(pi.x), to_bf(pi.y), to_bf(pi.z), to_bf(pi.w)}};
    } else {
      float pi = p[i], mi = m[i], vi = v[i];
      adamw_one(pi, g[i], mi, vi, h, decay);
      p[i] = pi, m[i] = mi, v[i] = vi;
      if (pc) pc[i] = to_bf(pi);
    }
  }
}

// Each block sums a fixed grid-stride subset in double, then the block in a fixed
// order; the host adds the kSumBlocks partials in order. x [n] f32, W = 4 elements a
// thread (one 16-byte load) when n % 4 == 0 and x is 16-byte aligned, else W = 1.
template <int W>
__global__ void sum_squares_kernel(double* partial, const float* x, int64_t n) {
  __shared__ double red[kBlock];
  double s = 0.0;
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * W; i < n;
       i += int64_t(gridDim.x) * blockDim.x * W) {
    if constexpr (W == 4) {
      const float4 v = *reinterpret_cast<const float4*>(x + i);
      s += double(v.x) * v.x + double(v.y) * v.y + double(v.z) * v.z + double(v.w) * v.w;
    } else {
      s += double(x[i]) * x[i];
    }
  }
  s = block_sum_f64<kBlock>(s, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// x [n] f32 *= a; W = 4 elements a thread (16-byte accesses) when n % 4 == 0 and x is
// 16-byte aligned (the gradient clip over the whole flat buffer), else W = 1.
template <int W>
__global__ void scale_kernel(float* x, float a, int64_t n) {
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * W; i < n;
       i += int64_t(gridDim.x) * blockDim.x * W) {
    if constexpr (W == 4) {
      float4 v = *reinterpret_cast<const float4*>(x + i);
      v.x *= a, v.y *= a, v.z *= a, v.w *= a;
      *reinterpret_cast<float4*>(x + i) = v;
    } else {
      x[i] *= a;
    }
  }
}

int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>(ceil_div(n, kBlock), 4096)); }

}  // namespace

void adamw_step(Tensor p, Tensor g, Tensor m, Tensor v, const AdamWHyper& h, Tensor p_compute) {
  for (const Tensor* t : {&p, &g, &m, &v}) expect(*t, DType::F32, "adamw buffer");
  const int64_t n = p.numel();
  LNS_CHECK(g.numel() == n && m.numel() == n && v.numel() == n);
  if (!p_compute.empty()) {
    expect(p_compute, DType::BF16, "adamw compute copy");
    LNS_CHECK(p_compute.numel() == n);
  }
  if (n == 0) return;
  const auto at = [](const Tensor& t, uintptr_t a) { return reinterpret_cast<uintptr_t>(t.data) % a == 0; };
  const bool wide = n % 4 == 0 && at(p, 16) && at(g, 16) && at(m, 16) && at(v, 16) &&
                    (p_compute.empty() || at(p_compute, 8));
  bf16* pc = p_compute.empty() ? nullptr : ptr<bf16>(p_compute);
  if (wide)
    LNS_LAUNCH(adamw_kernel<4>, grid_for(n / 4), kBlock, 0, stream())(ptr<float>(p), ptr<float>(g), ptr<float>(m),
                                                                    ptr<float>(v), pc, h, n);
  else
    LNS_LAUNCH(adamw_kernel<1>, grid_for(n), kBlock, 0, stream())(ptr<float>(p), ptr<float>(g), ptr<float>(m),
                                                                ptr<float>(v), pc, h, n);
  LNS_CUDA_LAUNCHED();
}

double sum_squares(Tensor x) {
  expect(x, DType::F32, "sum_squares");
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  auto* partial = static_cast<double*>(scratch(Scratch::Reduce, sizeof(double) * kSumBlocks));
  const bool wide = n % 4 == 0 && reinterpret_cast<uintptr_t>(x.data) % 16 == 0;
  const int blocks = static_cast<int>(std::min<int64_t>(ceil_div(n, int64_t(kBlock) * (wide ? 4 : 1)), kSumBlocks));
  if (wide)
    LNS_LAUNCH(sum_squares_kernel<4>, blocks, kBlock, 0, stream())(partial, ptr<float>(x), n);
  else
    LNS_LAUNCH(sum_squares_kernel<1>, blocks, kBlock, 0, stream())(partial, ptr<float>(x), n);
  LNS_CUDA_LAUNCHED();
  static double host[kSumBlocks];  // kept: no allocation per call in the training step
  LNS_CUDA_CHECK(cudaMemcpyAsync(host, partial, sizeof(double) * blocks, cudaMemcpyDeviceToHost, stream()));
  synchronize();
  double s = 0.0;
  for (int b = 0; b < blocks; ++b) s += host[b];
  return s;
}

void scale_inplace(Tensor x, float a) {
  expect(x, DType::F32, "scale_inplace");
  const int64_t n = x.numel();
  if (n == 0) return;
  if (n % 4 == 0 && reinterpret_cast<uintptr_t>(x.data) % 16 == 0)
    LNS_LAUNCH(scale_kernel<4>, grid_for(n / 4), kBlock, 0, stream())(ptr<float>(x), a, n);
  else
    LNS_LAUNCH(scale_kernel<1>, grid_for(n), kBlock, 0, stream())(ptr<float>(x), a, n);
  LNS_CUDA_LAUNCHED();
}

// This file's ops on CUDA (lns/core/op_table.h).
LNS_REGISTER_OPS(Device::CUDA) {
  LNS_REGISTER_OP(adamw_step, cuda::adamw_step);
  LNS_REGISTER_OP(sum_squares, cuda::sum_squares);
  LNS_REGISTER_OP(scale_inplace, cuda::scale_inplace);
}

}  // namespace lns::cuda
