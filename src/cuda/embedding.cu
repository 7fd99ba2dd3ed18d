// Token embedding forward and a deterministic backward. CPU reference:
// src/cpu/embedding.cpp.
//
// Backward without float atomics and without the host: the tokens of this rank are
// put in a stable order by row on the device (a token's place is the number of tokens
// with a smaller row plus the number of earlier tokens with the same row), so each
// vocabulary row's tokens form one run in token order; one thread per run and 8 columns
// (one, for odd widths) sums its run in that order and adds it to the f32 gradient.
// Nothing is read back: no host synchronisation (docs/cuda.md).
#include <algorithm>

#include "cuda/common.cuh"
#include "lns/core/device.h"
#include "lns/core/ops.h"

namespace lns::cuda {
namespace {

// out[n, :] = weight[ids[n] - row_begin, :], or 0 for another rank's row.   [N, C]
// W = 8 copies 16-byte vectors (rows aligned, C % 8 == 0).
template <int W>
__global__ void embedding_forward_kernel(bf16* out, const int32_t* ids, const bf16* weight,
                                         int64_t row_begin, int64_t rows, int C) {
  const int64_t n = blockIdx.x;
  const int64_t r = int64_t(ids[n]) - row_begin;
  const bool mine = r >= 0 && r < rows;
  for (int c = threadIdx.x * W; c < C; c += blockDim.x * W) {
    float f[W];
    if (mine) {
      load<W>(weight + r * C + c, f);
    } else {
#pragma unroll
      for (int k = 0; k < W; ++k) f[k] = 0.0f;
    }
    store<W>(out + n * C + c, f);  // bf16 -> f32 -> bf16 is exact
  }
}

// This rank's row of a token, or -1 for another rank's.
__device__ __forceinline__ int64_t row_of(const int32_t* ids, int64_t n, int64_t row_begin, int64_t rows) {
  const int64_t r = int64_t(ids[n]) - row_begin;
  return r >= 0 && r < rows ? r : -1;
}

constexpr int kSortThreads = 256;
constexpr int kSortWarps = kSortThreads / 32;  // tokens a block places: one a warp

// Stable counting order of the N tokens by row:
//   order[place(n)] = n, place(n) = #{s : row(s) < row(n)} + #{s < n : row(s) == row(n)},
// for this rank's tokens (place in [0, M)), and order[N] = M, their number.
// ids [N] -> order [N + 1]. O(N^2) comparisons (67M at a 1B micro-batch's 8192 tokens),
// no atomics, so the order is the same on every run. A warp per token n: the block
// stages 256 rows at a time in shared memory, and the warp's lanes compare 8 of them
// each, the counts summed over the warp. (One thread per token left 32 blocks to do it
// at N = 8192, each thread 8192 comparisons in a row.)
__global__ void embedding_order_kernel(int32_t* order, const int32_t* ids, int64_t row_begin, int64_t rows,
                                       int64_t N) {
  __shared__ int64_t tile[kSortThreads];
  const int lane = threadIdx.x % 32;
  const int64_t n = int64_t(blockIdx.x) * kSortWarps + threadIdx.x / 32;
  const int64_t r = n < N ? row_of(ids, n, row_begin, rows) : -1;
  int place = 0, mine = 0;  // N < 2^31 (checked by the caller)
  for (int64_t t0 = 0; t0 < N; t0 += kSortThreads) {
    __syncthreads();  // the previous tile has been read by every warp
    const int64_t s = t0 + threadIdx.x;
    tile[threadIdx.x] = s < N ? row_of(ids, s, row_begin, rows) : -1;
    __syncthreads();
    for (int k = lane; k < kSortThreads; k += 32) {
      const int64_t q = tile[k];
      mine += q >= 0;
      place += q >= 0 && (q < r || (q == r && t0 + k < n));
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    place += __shfl_xor_sync(0xffffffffu, place, o);
    mine += __shfl_xor_sync(0xffffffffu, mine, o);
  }
  if (lane != 0) return;
  if (n < N && r >= 0) order[place] = int32_t(n);
  if (n == 0) order[N] = int32_t(mine);
}

// One block per place k of the order, W columns a thread (8: 16-byte loads of dout and
// read-modify-writes of dweight, when C % 8 == 0 and both are aligned): the block at the
// start of a row's run sums the run's token gradients in token order into that row; the
// others return. order [N + 1], dout [N, C] bf16 -> dweight [rows, C] f32 (+=).
// (A block per place and 128 columns made 131k mostly idle blocks at N = 8192, C = 2048.)
template <int W>
__global__ void embedding_backward_kernel(float* dweight, const bf16* dout, const int32_t* order, const int32_t* ids,
                                          int64_t row_begin, int64_t N, int C) {
  const int64_t k = blockIdx.x;  // x: up to 2^31-1 places (y would cap them at 65535)
  const int64_t M = order[N];
  if (k >= M) return;
  const int32_t id = ids[order[k]];
  if (k > 0 && ids[order[k - 1]] == id) return;  // not the start of a run
  float* dst = dweight + (int64_t(id) - row_begin) * C;
  for (int c = threadIdx.x * W; c < C; c += blockDim.x * W) {
    float acc[W] = {};
    for (int64_t j = k; j < M && ids[order[j]] == id; ++j) {
      float f[W];
      load<W>(dout + int64_t(order[j]) * C + c, f);
#pragma unroll
      for (int q = 0; q < W; ++q) acc[q] += f[q];
    }
    if constexpr (W == kVec) {
      float4* d4 = reinterpret_cast<float4*>(dst + c);
      float4 a = d4[0], b = d4[1];
      a.x += acc[0], a.y += acc[1], a.z += acc[2], a.w += acc[3];
      b.x += acc[4], b.y += acc[5], b.z += acc[6], b.w += acc[7];
      d4[0] = a, d4[1] = b;
    } else {
      dst[c] += acc[0];
    }
  }
}

}  // namespace

void embedding_forward(Tensor out, Tensor ids, Tensor weight, int64_t row_begin) {
  expect(out, DType::BF16, "embedding out");
  expect(ids, DType::I32, "embedding ids");
  expect(weight, DType::BF16, "embedding weight");
  const int C = static_cast<int>(weight.dim(1));
  const int64_t N = ids.numel();
  LNS_CHECK(out.numel() == N * C);
  if (N == 0) return;
  auto* fn = vec_ok(out.data, C) && vec_ok(weight.data, C) ? embedding_forward_kernel<kVec>
                                                            : embedding_forward_kernel<1>;
  LNS_LAUNCH(fn, N, 256, 0, stream())(ptr<bf16>(out), ptr<int32_t>(ids), ptr<bf16>(weight), row_begin, weight.dim(0), C);
  LNS_CUDA_LAUNCHED();
}

void embedding_backward(Tensor dweight, Tensor ids, Tensor dout, int64_t row_begin) {
  expect(dweight, DType::F32, "embedding dweight");
  expect(ids, DType::I32, "embedding ids");
  expect(dout, DType::BF16, "embedding dout");
  const int64_t rows = dweight.dim(0), N = ids.numel();
  const int C = static_cast<int>(dweight.dim(1));
  LNS_CHECK(dout.numel() == N * C);
  LNS_CHECK(N < (int64_t{1} << 31)) << "embedding backward: token indices are int32";
  if (N == 0) return;
  // Sized by N alone, so it never grows after the first step (a regrowth synchronises).
  auto* order = static_cast<int32_t*>(scratch(Scratch::Embedding, (N + 1) * sizeof(int32_t)));
  LNS_LAUNCH(embedding_order_kernel, ceil_div(N, kSortWarps), kSortThreads, 0, stream())(
      order, ptr<int32_t>(ids), row_begin, rows, N);
  LNS_CUDA_LAUNCHED();
  const bool vec = vec_ok(dout.data, C) && reinterpret_cast<uintptr_t>(dweight.data) % 16 == 0;
  const int W = vec ? kVec : 1;
  const int64_t warps_wide = ceil_div(ceil_div(C, W), 32) * 32;  // one pass over the row, within 32..256
  const int threads = static_cast<int>(std::min<int64_t>(std::max<int64_t>(warps_wide, 32), 256));
  auto* fn = vec ? embedding_backward_kernel<kVec> : embedding_backward_kernel<1>;
  LNS_LAUNCH(fn, N, threads, 0, stream())(ptr<float>(dweight), ptr<bf16>(dout), order, ptr<int32_t>(ids), row_begin,
                                          N, C);
  LNS_CUDA_LAUNCHED();
}

// This file's ops on CUDA (lns/core/op_table.h).
LNS_REGISTER_OPS(Device::CUDA) {
  LNS_REGISTER_OP(embedding_forward, cuda::embedding_forward);
  LNS_REGISTER_OP(embedding_backward, cuda::embedding_backward);
}

}  // namespace lns::cuda
