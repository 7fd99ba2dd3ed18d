// The Gumbel-routed block's kernels (routed, mono, mono_reverse; include/lns/core/ops.h):
// the router's hard Gumbel-softmax gate and the per-sequence mix of the two paths.
// CPU reference: src/cpu/route.cpp. Sums are f64 in a fixed order (same bits each run).
// The gate is [B,2]: tiny next to the two block paths it chooses between, so these
// kernels are written for clarity; the mix is one pass over [B,T,C] each way.
#include "cuda/common.cuh"
#include "lns/core/ops.h"

namespace lns::cuda {
namespace {

constexpr int kBlock = 256;
constexpr int kMixSplit = 64;  // blocks per sequence in the mix backward's dgate sums
inline int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>(ceil_div(n, kBlock), 65535L * 16)); }

// m[b,c] = mean_t x[b,t,c] (f64, t in order)                 x [B,T,C] bf16; m [B,C]
__global__ void sequence_mean_kernel(double* m, const bf16* x, int64_t B, int64_t T, int64_t C) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < B * C; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / C, c = i % C;
    double s = 0.0;
    for (int64_t t = 0; t < T; ++t) s += to_f(x[(b * T + t) * C + c]);
    m[i] = s / double(T);
  }
}

// One block per sequence: logits = m[b] . w[k] + noise, then softmax and the hard gate.
// m [B,C] f64; w [2,C], noise, gate, soft [B,2] f32
__global__ void route_gate_kernel(float* gate, float* soft, const double* m, const float* w, const float* noise,
                                  int64_t C) {
  __shared__ double red[kBlock];
  const int64_t b = blockIdx.x;
  double d0 = 0.0, d1 = 0.0;
  for (int64_t c = threadIdx.x; c < C; c += kBlock) d0 += m[b * C + c] * w[c], d1 += m[b * C + c] * w[C + c];
  const double z0 = block_sum_f64<kBlock>(d0, red) + noise[b * 2];
  __syncthreads();  // every thread has read red[0] before the next sum writes it
  const double z1 = block_sum_f64<kBlock>(d1, red) + noise[b * 2 + 1];
  if (threadIdx.x == 0) {
    const double mx = fmax(z0, z1), e0 = exp(z0 - mx), e1 = exp(z1 - mx);
    soft[b * 2] = float(e0 / (e0 + e1)), soft[b * 2 + 1] = float(e1 / (e0 + e1));
    const bool one = z1 > z0;  // a tie picks path 0
    gate[b * 2] = one ? 0.0f : 1.0f, gate[b * 2 + 1] = one ? 1.0f : 0.0f;
  }
}

// The straight-through d logits of sequence b, entry k.
__device__ __forceinline__ float dlogit(const float* dgate, const float* soft, int64_t b, int k) {
  const double dot = double(dgate[b * 2]) * soft[b * 2] + double(dgate[b * 2 + 1]) * soft[b * 2 + 1];
  return float(soft[b * 2 + k] * (dgate[b * 2 + k] - dot));
}

// dw[k,c] += sum_b dlogits[b,k] m[b,c] (b in order)           dw [2,C]; m [B,C] f64
__global__ void route_dw_kernel(float* dw, const float* dgate, const float* soft, const double* m, int64_t B,
                                int64_t C) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < 2 * C; i += int64_t(gridDim.x) * blockDim.x) {
    const int k = static_cast<int>(i / C);
    const int64_t c = i % C;
    double s = 0.0;
    for (int64_t b = 0; b < B; ++b) s += double(dlogit(dgate, soft, b, k)) * m[b * C + c];
    dw[i] += float(s);
  }
}

// dx[b,t,c] += (dl[b,0] w[0,c] + dl[b,1] w[1,c]) / T          dx [B,T,C] bf16
__global__ void route_dx_kernel(bf16* dx, const float* dgate, const float* soft, const float* w, int64_t T,
                                int64_t C, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / (T * C), c = i % C;
    const float add = (dlogit(dgate, soft, b, 0) * w[c] + dlogit(dgate, soft, b, 1) * w[C + c]) / float(T);
    dx[i] = to_bf(to_f(dx[i]) + add);
  }
}

// y = gate[b,0] p0 + gate[b,1] p1; per = T*C elements a sequence    y, p0, p1 [B,T,C] bf16
__global__ void route_mix_kernel(bf16* y, const bf16* p0, const bf16* p1, const float* gate, int64_t per, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / per;
    y[i] = to_bf(gate[b * 2] * to_f(p0[i]) + gate[b * 2 + 1] * to_f(p1[i]));
  }
}

// Block (b, s) of grid (kMixSplit, B): chunk s of sequence b. dp_k = gate[b,k] dy, and
// partial[(b*kMixSplit + s)*2 + k] = sum over the chunk of dy * p_k. Each element is
// read before it is written, by the same thread (dp_k may alias dy).
__global__ void route_mix_backward_kernel(bf16* dp0, bf16* dp1, double* partial, const bf16* dy, const bf16* p0,
                                          const bf16* p1, const float* gate, int64_t per) {
  __shared__ double red[kBlock];
  const int64_t b = blockIdx.y, chunk = (per + kMixSplit - 1) / kMixSplit, lo = blockIdx.x * chunk,
                hi = lo + chunk < per ? lo + chunk : per;
  const float g0 = gate[b * 2], g1 = gate[b * 2 + 1];
  double s0 = 0.0, s1 = 0.0;
  for (int64_t j = lo + threadIdx.x; j < hi; j += kBlock) {
    const int64_t i = b * per + j;
    const float d = to_f(dy[i]);
    s0 += double(d) * to_f(p0[i]), s1 += double(d) * to_f(p1[i]);
    dp0[i] = to_bf(g0 * d), dp1[i] = to_bf(g1 * d);
  }
  s0 = block_sum_f64<kBlock>(s0, red);
  __syncthreads();  // every thread has read red[0] before the next sum writes it
  s1 = block_sum_f64<kBlock>(s1, red);
  if (threadIdx.x == 0) {
    partial[(b * kMixSplit + blockIdx.x) * 2] = s0;
    partial[(b * kMixSplit + blockIdx.x) * 2 + 1] = s1;
  }
}

// dgate[b,k] = sum_s partial[(b*kMixSplit + s)*2 + k], s in order
__global__ void route_dgate_kernel(float* dgate, const double* partial, int64_t B) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;  // b*2 + k
  if (i >= 2 * B) return;
  const int64_t b = i / 2, k = i % 2;
  double s = 0.0;
  for (int j = 0; j < kMixSplit; ++j) s += partial[(b * kMixSplit + j) * 2 + k];
  dgate[i] = float(s);
}

void sequence_means(double* m, const Tensor& x) {
  const int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2);
  LNS_LAUNCH(sequence_mean_kernel, grid_for(B * C), kBlock, 0, stream())(m, ptr<bf16>(x), B, T, C);
  LNS_CUDA_LAUNCHED();
}

}  // namespace

void route_gate_forward(Tensor gate, Tensor soft, Tensor x, Tensor w, Tensor noise) {
  expect(gate, DType::F32, "route gate");
  expect(soft, DType::F32, "route soft");
  expect(x, DType::BF16, "route x");
  expect(w, DType::F32, "route w");
  expect(noise, DType::F32, "route noise");
  const int64_t B = x.dim(0), C = x.dim(2);
  LNS_CHECK(x.shape.ndim == 3 && w.numel() == 2 * C && gate.numel() == 2 * B && soft.numel() == 2 * B &&
            noise.numel() == 2 * B);
  auto* m = static_cast<double*>(scratch(Scratch::Reduce, sizeof(double) * B * C));
  sequence_means(m, x);
  LNS_LAUNCH(route_gate_kernel, static_cast<int>(B), kBlock, 0, stream())(ptr<float>(gate), ptr<float>(soft), m,
                                                                          ptr<float>(w), ptr<float>(noise), C);
  LNS_CUDA_LAUNCHED();
}

void route_gate_backward(Tensor dx, Tensor dw, Tensor dgate, Tensor soft, Tensor x, Tensor w) {
  expect(dx, DType::BF16, "route dx");
  expect(dw, DType::F32, "route dw");
  expect(dgate, DType::F32, "route dgate");
  expect(soft, DType::F32, "route soft");
  expect(x, DType::BF16, "route x");
  expect(w, DType::F32, "route w");
  const int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2);
  LNS_CHECK(x.shape.ndim == 3 && dx.numel() == x.numel() && w.numel() == 2 * C && dw.numel() == 2 * C &&
            dgate.numel() == 2 * B && soft.numel() == 2 * B);
  auto* m = static_cast<double*>(scratch(Scratch::Reduce, sizeof(double) * B * C));
  sequence_means(m, x);
  LNS_LAUNCH(route_dw_kernel, grid_for(2 * C), kBlock, 0, stream())(ptr<float>(dw), ptr<float>(dgate),
                                                                    ptr<float>(soft), m, B, C);
  LNS_CUDA_LAUNCHED();
  LNS_LAUNCH(route_dx_kernel, grid_for(x.numel()), kBlock, 0, stream())(ptr<bf16>(dx), ptr<float>(dgate),
                                                                        ptr<float>(soft), ptr<float>(w), T, C,
                                                                        x.numel());
  LNS_CUDA_LAUNCHED();
}

void route_mix_forward(Tensor y, Tensor p0, Tensor p1, Tensor gate) {
  expect(y, DType::BF16, "route_mix y");
  expect(p0, DType::BF16, "route_mix p0");
  expect(p1, DType::BF16, "route_mix p1");
  expect(gate, DType::F32, "route_mix gate");
  const int64_t B = gate.numel() / 2, n = y.numel();
  LNS_CHECK(B > 0 && p0.numel() == n && p1.numel() == n && n % B == 0);
  if (n == 0) return;
  LNS_LAUNCH(route_mix_kernel, grid_for(n), kBlock, 0, stream())(ptr<bf16>(y), ptr<bf16>(p0), ptr<bf16>(p1),
                                                                 ptr<float>(gate), n / B, n);
  LNS_CUDA_LAUNCHED();
}

void route_mix_backward(Tensor dp0, Tensor dp1, Tensor dgate, Tensor dy, Tensor p0, Tensor p1, Tensor gate) {
  expect(dp0, DType::BF16, "route_mix dp0");
  expect(dp1, DType::BF16, "route_mix dp1");
  expect(dgate, DType::F32, "route_mix dgate");
  expect(dy, DType::BF16, "route_mix dy");
  expect(p0, DType::BF16, "route_mix p0");
  expect(p1, DType::BF16, "route_mix p1");
  expect(gate, DType::F32, "route_mix gate");
  const int64_t B = gate.numel() / 2, n = dy.numel();
  LNS_CHECK(B > 0 && dp0.numel() == n && dp1.numel() == n && p0.numel() == n && p1.numel() == n && n % B == 0 &&
            dgate.numel() == 2 * B);
  auto* partial = static_cast<double*>(scratch(Scratch::Reduce, sizeof(double) * B * kMixSplit * 2));
  LNS_LAUNCH(route_mix_backward_kernel, dim3(kMixSplit, static_cast<unsigned>(B)), kBlock, 0, stream())(
      ptr<bf16>(dp0), ptr<bf16>(dp1), partial, ptr<bf16>(dy), ptr<bf16>(p0), ptr<bf16>(p1), ptr<float>(gate), n / B);
  LNS_CUDA_LAUNCHED();
  LNS_LAUNCH(route_dgate_kernel, static_cast<int>(ceil_div(2 * B, kBlock)), kBlock, 0, stream())(
      ptr<float>(dgate), partial, B);
  LNS_CUDA_LAUNCHED();
}

// This file's ops on CUDA (lns/core/op_table.h).
LNS_REGISTER_OPS(Device::CUDA) {
  LNS_REGISTER_OP(route_gate_forward, cuda::route_gate_forward);
  LNS_REGISTER_OP(route_gate_backward, cuda::route_gate_backward);
  LNS_REGISTER_OP(route_mix_forward, cuda::route_mix_forward);
  LNS_REGISTER_OP(route_mix_backward, cuda::route_mix_backward);
}

}  // namespace lns::cuda
