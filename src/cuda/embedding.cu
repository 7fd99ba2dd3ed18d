// Token embedding forward and a deterministic backward. CPU reference:
// src/cpu/embedding.cpp.
//
// Backward without float atomics and without the host: the tokens of this rank are
// put in a stable order by row on the device (a token's place is the number of tokens
// with a smaller row plus the number of earlier tokens with the same row), so each
// vocabulary row's tokens form one run in token order; one thread per (run, column)
// sums its run in that order and adds it to the f32 gradient. Nothing is read back:
// no host synchronisation (docs/cuda.md).
#include "cuda/common.cuh"
#include "lns/device.h"
#include "cuda/ops_cuda.h"

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

// Stable counting order of the N tokens by row, one thread per token:
//   order[place(n)] = n, place(n) = #{s : row(s) < row(n)} + #{s < n : row(s) == row(n)},
// for this rank's tokens (place in [0, M)), and order[N] = M, their number.
// ids [N] -> order [N + 1]. O(N^2) comparisons from shared-memory tiles: at the
// 8192 tokens of a 1B micro-batch about 67M, a few microseconds spread over the GPU,
// and no atomics, so the order is the same on every run.
__global__ void embedding_order_kernel(int32_t* order, const int32_t* ids, int64_t row_begin, int64_t rows,
                                       int64_t N) {
  __shared__ int64_t tile[kSortThreads];
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t r = n < N ? row_of(ids, n, row_begin, rows) : -1;
  int64_t place = 0, mine = 0;
  for (int64_t t0 = 0; t0 < N; t0 += blockDim.x) {
    __syncthreads();  // the previous tile has been read by every thread
    const int64_t s = t0 + threadIdx.x;
    tile[threadIdx.x] = s < N ? row_of(ids, s, row_begin, rows) : -1;
    __syncthreads();
    const int64_t len = N - t0 < int64_t(blockDim.x) ? N - t0 : int64_t(blockDim.x);
    for (int64_t k = 0; k < len; ++k) {
      const int64_t q = tile[k];
      mine += q >= 0;
      place += q >= 0 && (q < r || (q == r && t0 + k < n));
    }
  }
  if (n < N && r >= 0) order[place] = int32_t(n);
  if (n == 0) order[N] = int32_t(mine);
}

// One block per place k of the order and 128 columns: the block at the start of a
// row's run sums the run's token gradients in token order into that row; the others
// return. order [N + 1], dout [N, C] bf16 -> dweight [rows, C] f32 (+=).
__global__ void embedding_backward_kernel(float* dweight, const bf16* dout, const int32_t* order,
                                          const int32_t* ids, int64_t row_begin, int64_t N, int C) {
  const int64_t k = blockIdx.x;  // x: up to 2^31-1 places (y would cap them at 65535)
  const int64_t M = order[N];
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (k >= M || c >= C) return;
  const int32_t id = ids[order[k]];
  if (k > 0 && ids[order[k - 1]] == id) return;  // not the start of a run
  float acc = 0.0f;
  for (int64_t j = k; j < M && ids[order[j]] == id; ++j) acc += to_f(dout[int64_t(order[j]) * C + c]);
  dweight[(int64_t(id) - row_begin) * C + c] += acc;
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
  LNS_LAUNCH(embedding_order_kernel, ceil_div(N, kSortThreads), kSortThreads, 0, stream())(
      order, ptr<int32_t>(ids), row_begin, rows, N);
  LNS_CUDA_LAUNCHED();
  const dim3 grid(static_cast<unsigned>(N), static_cast<unsigned>(ceil_div(C, 128)));
  LNS_LAUNCH(embedding_backward_kernel, grid, 128, 0, stream())(ptr<float>(dweight), ptr<bf16>(dout), order,
                                                        ptr<int32_t>(ids), row_begin, N, C);
  LNS_CUDA_LAUNCHED();
}

}  // namespace lns::cuda
