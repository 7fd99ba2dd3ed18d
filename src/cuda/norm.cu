// Fused residual add + RMSNorm / LayerNorm + gain (+ bias) + LNS scale, forward and
// backward, bf16 activations with f32 statistics. CPU reference: src/cpu/norm.cpp.
//
// Forward: one block per row. The row is read once from DRAM; the second and third
// passes (variance, output) work on registers (one 16-byte chunk per thread, the
// *_chunk kernels, C <= 8192) or re-read it from L1/L2. Only rstd (and mean) are saved.
// Backward: a fixed grid of row-strided blocks; each thread owns fixed columns, so
// it accumulates dgain/dbias for them without atomics (in registers when it owns one
// 16-byte chunk of the row, the *_chunk kernels, else in shared memory); the per-block
// partials [G, C] are summed over G in a fixed order by a second kernel. The grid
// depends only on N and C, so two runs give the same bits.
#include <algorithm>
#include <vector>

#include "cuda/common.cuh"
#include "lns/core/ops.h"

namespace lns::cuda {
namespace {


// LN-free fine-tuning (docs/ln_free.md): the divisor of x's row `row` is a constant,
// pos0 or rest as fixed_uses_pos0 (include/lns/core/ops.h) says for micro-batch row row0 + row
// and its token ids[row] (read here, on the device). rest == 0: the norm is live.
struct FixedArgs {
  float pos0 = 0.0f, rest = 0.0f;
  int64_t T = 1, row0 = 0;
  const int32_t* ids = nullptr;  // [N] when eot >= 0
  int32_t eot = -1;
  __device__ __forceinline__ float rstd(int64_t row) const {
    return 1.0f / (fixed_uses_pos0(row0 + row, T, eot >= 0 ? ids[row] : 0, eot) ? pos0 : rest);
  }
};

// x[N,C] = alpha * res_in + delta (stored to res_out when delta is given, else x =
// res_in); out[N,C] = scale * ((x - mean) * rstd * gain + bias), rstd measured or
// (fixed.rest > 0) the constant of fixed.
template <int W, bool kLayerNorm>
__global__ void norm_forward_kernel(bf16* __restrict__ out, float* __restrict__ mean_out,
                                    float* __restrict__ rstd_out, bf16* res_out, const bf16* res_in,
                                    const bf16* __restrict__ delta, float alpha,
                                    const float* __restrict__ gain, const float* __restrict__ bias,
                                    float scale, float eps, int C, FixedArgs fixed) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const bf16* xin = res_in + row * C;
  const bf16* d = delta ? delta + row * C : nullptr;
  bf16* xr = delta ? res_out + row * C : const_cast<bf16*>(xin);  // the normalised input
  float s1 = 0.0f, s2 = 0.0f;
  for (int c = threadIdx.x * W; c < C; c += blockDim.x * W) {
    float x[W];
    load<W>(xin + c, x);
    if (d) {
      float dv[W];
      load<W>(d + c, dv);
#pragma unroll
      for (int k = 0; k < W; ++k) x[k] = to_f(to_bf(alpha * x[k] + dv[k]));  // as stored
      store<W>(xr + c, x);
    }
#pragma unroll
    for (int k = 0; k < W; ++k) s1 += x[k], s2 += x[k] * x[k];
  }
  float mean = 0.0f, var;
  if constexpr (kLayerNorm) {
    mean = block_sum(s1, red) / C;
    float sq = 0.0f;  // second pass around the mean: no cancellation
    for (int c = threadIdx.x * W; c < C; c += blockDim.x * W) {
      float x[W];
      load<W>(xr + c, x);
#pragma unroll
      for (int k = 0; k < W; ++k) sq += (x[k] - mean) * (x[k] - mean);
    }
    var = block_sum(sq, red) / C;
  } else {
    var = block_sum(s2, red) / C;
  }
  const float rstd = fixed.rest > 0.0f ? fixed.rstd(row) : rsqrtf(var + eps);
  for (int c = threadIdx.x * W; c < C; c += blockDim.x * W) {
    float x[W];
    load<W>(xr + c, x);
#pragma unroll
    for (int k = 0; k < W; ++k)
      x[k] = scale * ((x[k] - mean) * rstd * gain[c + k] + (bias ? bias[c + k] : 0.0f));
    store<W>(out + row * C + c, x);
  }
  if (threadIdx.x == 0) {
    rstd_out[row] = rstd;
    if (mean_out) mean_out[row] = mean;
  }
}

// The same, when each thread's share of the row is one 16-byte chunk (C <= 8 x 1024,
// every model here): the chunk stays in registers through the passes, so the row is
// read from memory once and never re-read (the loop above reads it up to three
// times). Each thread's sums are those of the loop above, in the same order.
template <bool kLayerNorm>
__global__ void norm_forward_chunk_kernel(bf16* __restrict__ out, float* __restrict__ mean_out,
                                          float* __restrict__ rstd_out, bf16* res_out, const bf16* res_in,
                                          const bf16* __restrict__ delta, float alpha,
                                          const float* __restrict__ gain, const float* __restrict__ bias,
                                          float scale, float eps, int C, FixedArgs fixed) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x, c = int64_t(threadIdx.x) * kVec;  // 64-bit: see the backward's note
  const bool mine = c < C;
  float x[kVec] = {};  // [kVec] this thread's columns c..c+7 of the row
  if (mine) {
    load<kVec>(res_in + row * C + c, x);
    if (delta) {
      float dv[kVec];
      load<kVec>(delta + row * C + c, dv);
#pragma unroll
      for (int k = 0; k < kVec; ++k) x[k] = to_f(to_bf(alpha * x[k] + dv[k]));  // as stored
      store<kVec>(res_out + row * C + c, x);
    }
  }
  float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
  for (int k = 0; k < kVec; ++k) s1 += x[k], s2 += x[k] * x[k];
  float mean = 0.0f, var;
  if constexpr (kLayerNorm) {
    mean = block_sum(s1, red) / C;
    float sq = 0.0f;
    if (mine) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) sq += (x[k] - mean) * (x[k] - mean);
    }
    var = block_sum(sq, red) / C;
  } else {
    var = block_sum(s2, red) / C;
  }
  const float rstd = fixed.rest > 0.0f ? fixed.rstd(row) : rsqrtf(var + eps);
  if (mine) {
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      x[k] = scale * ((x[k] - mean) * rstd * gain[c + k] + (bias ? bias[c + k] : 0.0f));
    store<kVec>(out + row * C + c, x);
  }
  if (threadIdx.x == 0) {
    rstd_out[row] = rstd;
    if (mean_out) mean_out[row] = mean;
  }
}

// dx = dres + rstd * (dxhat - mean(dxhat) [LayerNorm] - xhat * mean(dxhat * xhat)),
// the last term absent when the divisor is a constant (fixed: LN-free),
// dxhat = scale * dout * gain; partial[blockIdx, c] = sum over this block's rows of
// scale * dout * xhat (dgain) and, for LayerNorm, scale * dout (dbias).
// The column index is 64-bit: with an int, nvcc split the 16-byte dx store into
// 8 two-byte stores (SASS STG.U16; tools/perf/sass_check.py guards this).
template <int W, bool kLayerNorm>
__global__ void norm_backward_kernel(bf16* dx, float* __restrict__ partial, const bf16* dres,
                                     const bf16* __restrict__ dout, const bf16* __restrict__ x,
                                     const float* __restrict__ mean, const float* __restrict__ rstd,
                                     const float* __restrict__ gain, float scale, int N, int C,
                                     bool fixed) {
  LNS_EXTERN_SHARED(float, acc);  // [C] dgain, then [C] dbias (LayerNorm)
  __shared__ float red[32];
  for (int c = threadIdx.x; c < (kLayerNorm ? 2 : 1) * C; c += blockDim.x) acc[c] = 0.0f;
  __syncthreads();
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const float m = kLayerNorm ? mean[row] : 0.0f, r = rstd[row];
    const int64_t base = row * C;
    float s1 = 0.0f, s2 = 0.0f;
    for (int64_t c = threadIdx.x * W; c < C; c += blockDim.x * W) {
      float xv[W], dy[W];
      load<W>(x + base + c, xv);
      load<W>(dout + base + c, dy);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float xhat = (xv[k] - m) * r, g = scale * dy[k];
        const float dxhat = g * gain[c + k];
        s1 += dxhat, s2 += dxhat * xhat;
        acc[c + k] += g * xhat;  // only this thread touches column c + k
        if (kLayerNorm) acc[C + c + k] += g;
      }
    }
    const float m1 = kLayerNorm ? block_sum(s1, red) / C : 0.0f;
    const float m2 = fixed ? 0.0f : block_sum(s2, red) / C;  // uniform over the block
    for (int64_t c = threadIdx.x * W; c < C; c += blockDim.x * W) {
      float xv[W], dy[W], dr[W];
      load<W>(x + base + c, xv);
      load<W>(dout + base + c, dy);
      if (dres) load<W>(dres + base + c, dr);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float xhat = (xv[k] - m) * r, dxhat = scale * dy[k] * gain[c + k];
        xv[k] = r * (dxhat - m1 - xhat * m2) + (dres ? dr[k] : 0.0f);
      }
      store<W>(dx + base + c, xv);
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < (kLayerNorm ? 2 : 1) * C; c += blockDim.x)
    partial[int64_t(blockIdx.x) * (kLayerNorm ? 2 : 1) * C + c] = acc[c];
}

// The same when each thread's share of a row is one 16-byte chunk (C <= 8 x 1024): x,
// dout, the gain and this thread's dgain/dbias sums live in registers, so each row is
// read once (the loop above reads x and dout twice) and the sums skip shared memory.
// Rows, columns and the order of every sum are those of the loop above.
template <bool kLayerNorm>
__global__ void norm_backward_chunk_kernel(bf16* dx, float* __restrict__ partial, const bf16* dres,
                                           const bf16* __restrict__ dout, const bf16* __restrict__ x,
                                           const float* __restrict__ mean, const float* __restrict__ rstd,
                                           const float* __restrict__ gain, float scale, int N, int C,
                                           bool fixed) {
  __shared__ float red[32];
  const int64_t c = int64_t(threadIdx.x) * kVec;
  const bool mine = c < C;
  float g_c[kVec], dgain[kVec] = {}, dbias[kVec] = {};  // [kVec] each: columns c..c+7
#pragma unroll
  for (int k = 0; k < kVec; ++k) g_c[k] = mine ? gain[c + k] : 0.0f;
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const float m = kLayerNorm ? mean[row] : 0.0f, r = rstd[row];
    const int64_t base = row * C;
    float xv[kVec] = {}, dy[kVec] = {}, xhat[kVec], dxhat[kVec];
    if (mine) load<kVec>(x + base + c, xv), load<kVec>(dout + base + c, dy);
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      xhat[k] = (xv[k] - m) * r;
      const float g = scale * dy[k];
      dxhat[k] = g * g_c[k];
      s1 += dxhat[k], s2 += dxhat[k] * xhat[k];
      dgain[k] += g * xhat[k];
      if (kLayerNorm) dbias[k] += g;
    }
    const float m1 = kLayerNorm ? block_sum(s1, red) / C : 0.0f;
    const float m2 = fixed ? 0.0f : block_sum(s2, red) / C;  // uniform over the block
    if (mine) {
      float dr[kVec];
      if (dres) load<kVec>(dres + base + c, dr);
#pragma unroll
      for (int k = 0; k < kVec; ++k) xv[k] = r * (dxhat[k] - m1 - xhat[k] * m2) + (dres ? dr[k] : 0.0f);
      store<kVec>(dx + base + c, xv);
    }
  }
  if (mine) {
    float* p = partial + int64_t(blockIdx.x) * (kLayerNorm ? 2 : 1) * C;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      p[c + k] = dgain[k];
      if (kLayerNorm) p[C + c + k] = dbias[k];
    }
  }
}

// out[c] += sum over g of partial[g * stride + c] for c < count. A block takes 32 columns
// with its 8 warps: warp w sums g = w, w + 8, ... in order, then warp 0 adds the 8 sums in
// order: a fixed order, the same bits on every run. (One thread per column over all G had
// 8 blocks at C = 2048, each reading 512 KB one float at a time: tens of microseconds
// after every norm backward.)
constexpr int kSumCols = 32, kSumWarps = 8;
__global__ void norm_sum_partials_kernel(float* __restrict__ out, const float* __restrict__ partial, int G, int count,
                                         int stride) {
  __shared__ float sums[kSumWarps][kSumCols];
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const int64_t c = int64_t(blockIdx.x) * kSumCols + lane;
  float s = 0.0f;
  if (c < count) {
#pragma unroll 8
    for (int g = w; g < G; g += kSumWarps) s += partial[int64_t(g) * stride + c];
  }
  sums[w][lane] = s;
  __syncthreads();
  if (w != 0 || c >= count) return;
  float t = 0.0f;
#pragma unroll
  for (int k = 0; k < kSumWarps; ++k) t += sums[k][lane];
  out[c] += t;
}

int block_for(int C, int W) {  // enough threads for one pass over the row, within limits
  const int want = static_cast<int>(ceil_div(C / W, 32) * 32);
  return want < 64 ? 64 : (want > 1024 ? 1024 : want);
}

void check_args(NormType type, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                const Tensor& x, const Tensor& gain, const Tensor& bias) {
  expect(x, DType::BF16, "norm input");
  expect(out, DType::BF16, "norm output");
  expect(rstd, DType::F32, "rstd");
  expect(gain, DType::F32, "norm gain");
  const int64_t C = x.dim(-1), N = x.numel() / C;
  LNS_CHECK(out.numel() == N * C && gain.numel() == C && rstd.numel() == N);
  if (type == NormType::LayerNorm) {
    expect(mean, DType::F32, "mean");
    expect(bias, DType::F32, "bias");
    LNS_CHECK(mean.numel() == N && bias.numel() == C);
  } else {
    LNS_CHECK(bias.empty()) << "RMSNorm has no bias";
  }
}

void launch_forward(NormType type, Tensor res_out, Tensor out, Tensor mean, Tensor rstd, Tensor x,
                    Tensor delta, float alpha, Tensor gain, Tensor bias, float scale, float eps,
                    FixedArgs fixed = {}) {
  check_args(type, out, mean, rstd, x, gain, bias);
  const int C = static_cast<int>(x.dim(-1));
  const int64_t N = x.numel() / C;
  if (N == 0) return;
  const bool vec = vec_ok(x.data, C) && vec_ok(out.data, C) && (delta.empty() || (vec_ok(delta.data, C) && vec_ok(res_out.data, C)));
  const bool ln = type == NormType::LayerNorm;
  const int W = vec ? kVec : 1;
  const bool chunk = vec && C <= block_for(C, W) * W;  // one 16-byte chunk per thread
  auto* fn = chunk ? (ln ? norm_forward_chunk_kernel<true> : norm_forward_chunk_kernel<false>)
             : vec ? (ln ? norm_forward_kernel<kVec, true> : norm_forward_kernel<kVec, false>)
                   : (ln ? norm_forward_kernel<1, true> : norm_forward_kernel<1, false>);
  LNS_LAUNCH(fn, N, block_for(C, W), 0, stream())(
      ptr<bf16>(out), ln ? ptr<float>(mean) : nullptr, ptr<float>(rstd),
      delta.empty() ? nullptr : ptr<bf16>(res_out), ptr<bf16>(x),
      delta.empty() ? nullptr : ptr<bf16>(delta), alpha, ptr<float>(gain),
      bias.empty() ? nullptr : ptr<float>(bias), scale, eps, C, fixed);
  LNS_CUDA_LAUNCHED();
}

void launch_backward(NormType type, Tensor dx, Tensor dgain, Tensor dbias, Tensor dres, Tensor dout,
                     Tensor x, Tensor mean, Tensor rstd, Tensor gain, float scale, bool fixed) {
  const bool ln = type == NormType::LayerNorm;
  check_args(type, dout, mean, rstd, x, gain, ln ? dbias : Tensor{});
  expect(dx, DType::BF16, "norm dx");
  expect(dgain, DType::F32, "norm dgain");
  if (!dres.empty()) expect(dres, DType::BF16, "norm dres");
  const int C = static_cast<int>(x.dim(-1));
  const int64_t N = x.numel() / C;
  LNS_CHECK(dx.numel() == N * C && (dres.empty() || dres.numel() == N * C) && dgain.numel() == C);
  if (N == 0) return;
  const bool vec = vec_ok(x.data, C) && vec_ok(dout.data, C) && vec_ok(dx.data, C) &&
                   (dres.empty() || vec_ok(dres.data, C));
  const int W = vec ? kVec : 1;
  // Fixed by N and C (deterministic). 512 blocks of C/8 threads: about half of an
  // H100's threads at C = 2048 (256 gave 25%); the [G, C] partials stay a few MB.
  // Narrower rows get proportionally more blocks (C = 768, 130M: 96 threads, 1,024
  // blocks), so that as many rows are in flight as at C = 2048: 512 blocks of 96 threads
  // left 18% of the threads busy. tools/perf/step_model.py counts the partials by it.
  const int64_t blocks = int64_t{512} * std::max(1, 256 / block_for(C, W));
  const int G = static_cast<int>(std::min(N, blocks));
  const int width = (ln ? 2 : 1) * C;
  auto* partial = static_cast<float*>(scratch(Scratch::NormPartials, sizeof(float) * G * width));
  const bool chunk = vec && C <= block_for(C, W) * W;  // one 16-byte chunk per thread
  const size_t smem = chunk ? 0 : sizeof(float) * width;
  auto* fn = chunk ? (ln ? norm_backward_chunk_kernel<true> : norm_backward_chunk_kernel<false>)
             : vec ? (ln ? norm_backward_kernel<kVec, true> : norm_backward_kernel<kVec, false>)
                   : (ln ? norm_backward_kernel<1, true> : norm_backward_kernel<1, false>);
  if (smem > 48 * 1024)
    LNS_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  LNS_LAUNCH(fn, G, block_for(C, W), smem, stream())(
      ptr<bf16>(dx), partial, dres.empty() ? nullptr : ptr<bf16>(dres), ptr<bf16>(dout),
      ptr<bf16>(x), ln ? ptr<float>(mean) : nullptr, ptr<float>(rstd), ptr<float>(gain), scale,
      static_cast<int>(N), C, fixed);
  LNS_CUDA_LAUNCHED();
  const int sum_blocks = static_cast<int>(ceil_div(C, kSumCols)), sum_threads = 32 * kSumWarps;
  LNS_LAUNCH(norm_sum_partials_kernel, sum_blocks, sum_threads, 0, stream())(ptr<float>(dgain), partial, G, C, width);
  LNS_CUDA_LAUNCHED();
  if (ln) {  // the dbias half of each block's partial row: columns [C, 2C)
    LNS_LAUNCH(norm_sum_partials_kernel, sum_blocks, sum_threads, 0, stream())(ptr<float>(dbias), partial + C, G, C,
                                                                              width);
    LNS_CUDA_LAUNCHED();
  }
}

// divisor[row] = sqrt(var + eps) of x's row (f64; var around the mean for LayerNorm,
// the mean square for RMSNorm). One block of kDivThreads per row.   x [N,C] bf16
constexpr int kDivThreads = 256;
template <bool kLayerNorm>
__global__ void norm_divisor_kernel(double* __restrict__ divisor, const bf16* __restrict__ x, int C, float eps) {
  __shared__ double red[kDivThreads];
  const bf16* xr = x + int64_t(blockIdx.x) * C;
  double mean = 0.0;
  if constexpr (kLayerNorm) {
    double s = 0.0;
    for (int c = threadIdx.x; c < C; c += kDivThreads) s += to_f(xr[c]);
    mean = block_sum_f64<kDivThreads>(s, red) / C;
    __syncthreads();  // every thread has read red[0] before the next sum writes it
  }
  double sq = 0.0;
  for (int c = threadIdx.x; c < C; c += kDivThreads) {
    const double d = to_f(xr[c]) - mean;
    sq += d * d;
  }
  const double var = block_sum_f64<kDivThreads>(sq, red) / C;
  if (threadIdx.x == 0) divisor[blockIdx.x] = sqrt(var + double(eps));
}

}  // namespace

void norm_forward(NormType type, Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor gain,
                  Tensor bias, float scale, float eps) {
  launch_forward(type, {}, out, mean, rstd, x, {}, 1.0f, gain, bias, scale, eps);
}

void residual_norm_forward(NormType type, Tensor res_out, Tensor out, Tensor mean, Tensor rstd,
                           Tensor res_in, Tensor delta, float alpha, Tensor gain, Tensor bias,
                           float scale, float eps) {
  expect(delta, DType::BF16, "residual delta");
  expect(res_out, DType::BF16, "residual output");
  LNS_CHECK(delta.numel() == res_in.numel() && res_out.numel() == res_in.numel());
  launch_forward(type, res_out, out, mean, rstd, res_in, delta, alpha, gain, bias, scale, eps);
}

void norm_backward(NormType type, Tensor dx, Tensor dgain, Tensor dbias, Tensor dres, Tensor dout,
                   Tensor x, Tensor mean, Tensor rstd, Tensor gain, float scale) {
  launch_backward(type, dx, dgain, dbias, dres, dout, x, mean, rstd, gain, scale, false);
}

void norm_forward_fixed(NormType type, Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor gain,
                        Tensor bias, float scale, FixedDivisor d) {
  LNS_CHECK(d.T > 0 && d.row0 >= 0 && d.rest > 0.0f && d.pos0 > 0.0f);
  FixedArgs f;
  f.pos0 = d.pos0, f.rest = d.rest, f.T = d.T, f.row0 = d.row0, f.eot = d.eot;
  if (d.eot >= 0) {  // the end-of-text case reads each row's token on the device: no sync
    expect(d.ids, DType::I32, "fixed-divisor token ids");
    LNS_CHECK(d.ids.numel() == x.numel() / x.dim(-1)) << "end-of-text case needs ids [N] i32";
    f.ids = ptr<int32_t>(d.ids);
  }
  launch_forward(type, {}, out, mean, rstd, x, {}, 1.0f, gain, bias, scale, 0.0f, f);
}

void norm_backward_fixed(NormType type, Tensor dx, Tensor dgain, Tensor dbias, Tensor dres, Tensor dout,
                         Tensor x, Tensor mean, Tensor rstd, Tensor gain, float scale) {
  launch_backward(type, dx, dgain, dbias, dres, dout, x, mean, rstd, gain, scale, true);
}

void norm_divisor_sums(NormType type, Tensor x, int64_t T, float eps, double sums[4], int64_t row0) {
  expect(x, DType::BF16, "norm_divisor_sums x");
  const int C = static_cast<int>(x.dim(-1));
  const int64_t N = x.numel() / C;
  if (N == 0) return;
  auto* div = static_cast<double*>(scratch(Scratch::Reduce, sizeof(double) * N));
  auto* fn = type == NormType::LayerNorm ? norm_divisor_kernel<true> : norm_divisor_kernel<false>;
  LNS_LAUNCH(fn, N, kDivThreads, 0, stream())(div, ptr<bf16>(x), C, eps);
  LNS_CUDA_LAUNCHED();
  // Summed on the host in row order, as the CPU op does (calibration is rare: one copy).
  std::vector<double> host(N);
  LNS_CUDA_CHECK(cudaMemcpyAsync(host.data(), div, sizeof(double) * N, cudaMemcpyDeviceToHost, stream()));
  LNS_CUDA_CHECK(cudaStreamSynchronize(stream()));
  for (int64_t n = 0; n < N; ++n) {
    const int k = fixed_uses_pos0(row0 + n, T, 0, -1) ? 0 : 2;
    sums[k] += host[n];
    sums[k + 1] += 1.0;
  }
}

// This file's ops on CUDA (lns/core/op_table.h).
LNS_REGISTER_OPS(Device::CUDA) {
  LNS_REGISTER_OP(norm_forward, cuda::norm_forward);
  LNS_REGISTER_OP(residual_norm_forward, cuda::residual_norm_forward);
  LNS_REGISTER_OP(norm_backward, cuda::norm_backward);
  LNS_REGISTER_OP(norm_forward_fixed, cuda::norm_forward_fixed);
  LNS_REGISTER_OP(norm_backward_fixed, cuda::norm_backward_fixed);
  LNS_REGISTER_OP(norm_divisor_sums, cuda::norm_divisor_sums);
}

}  // namespace lns::cuda
