// Token embedding forward and a deterministic backward. CPU reference:
// src/cpu/embedding.cpp.
//
// Backward without float atomics: the ids (a few KB, copied back to the host at the
// end of backward) are sorted by row with a stable counting sort on the host, so each
// vocabulary row's tokens form one segment in token order; one thread per (row,
// column) sums its segment in that order and adds it to the f32 gradient.
#include <vector>

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

// segment s covers order[start[s] .. start[s+1]) and belongs to weight row row_of[s].
__global__ void embedding_backward_kernel(float* dweight, const bf16* dout, const int32_t* order,
                                          const int32_t* start, const int32_t* row_of, int C) {
  const int s = blockIdx.x;  // x: up to 2^31-1 segments (y would cap them at 65535)
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int k = start[s]; k < start[s + 1]; ++k) acc += to_f(dout[int64_t(order[k]) * C + c]);
  dweight[int64_t(row_of[s]) * C + c] += acc;
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
  expect(dout, DType::BF16, "embedding dout");
  const int64_t rows = dweight.dim(0), N = ids.numel();
  const int C = static_cast<int>(dweight.dim(1));
  LNS_CHECK(dout.numel() == N * C);
  // Host work buffers, kept between calls: nothing is allocated once they have grown.
  static std::vector<int32_t> h, count, next, packed;
  h.resize(N);
  copy_tensor(Tensor{h.data(), DType::I32, Device::CPU, Shape{N}}, ids);
  // Stable counting sort of this rank's tokens by row. packed = [order | start | row_of]:
  // order lists token indices grouped by row (token order within a row); segment s
  // covers order[start[s] .. start[s+1]) and belongs to row row_of[s].
  count.assign(rows + 1, 0);
  for (int32_t id : h)
    if (id - row_begin >= 0 && id - row_begin < rows) ++count[id - row_begin + 1];
  for (int64_t r = 0; r < rows; ++r) count[r + 1] += count[r];
  const int64_t mine = count[rows];
  int segments = 0;
  for (int64_t r = 0; r < rows; ++r) segments += count[r + 1] > count[r];
  if (segments == 0) return;
  packed.resize(mine + 2 * segments + 1);
  int32_t *order = packed.data(), *start = order + mine, *row_of = start + segments + 1;
  next.assign(count.begin(), count.end() - 1);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t r = h[n] - row_begin;
    if (r >= 0 && r < rows) order[next[r]++] = static_cast<int32_t>(n);
  }
  for (int64_t r = 0, k = 0; r < rows; ++r)
    if (count[r + 1] > count[r]) start[k] = count[r], row_of[k] = static_cast<int32_t>(r), ++k;
  start[segments] = static_cast<int32_t>(mine);
  // Sized for the worst case of N tokens (order <= N, start <= N + 1, row_of <= N), so it
  // never grows after the first step (a regrowth synchronises the whole device).
  auto* dev = static_cast<int32_t*>(scratch(Scratch::Embedding, (3 * N + 1) * sizeof(int32_t)));
  LNS_CUDA_CHECK(cudaMemcpyAsync(dev, packed.data(), packed.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream()));
  const dim3 grid(static_cast<unsigned>(segments), static_cast<unsigned>(ceil_div(C, 128)));
  LNS_LAUNCH(embedding_backward_kernel, grid, 128, 0, stream())(ptr<float>(dweight), ptr<bf16>(dout), dev, dev + mine,
                                                        dev + mine + segments + 1, C);
  LNS_CUDA_LAUNCHED();
  // No synchronisation needed for `packed`: a copy from pageable memory returns once
  // the source has been staged (CUDA's API synchronisation rules).
}

}  // namespace lns::cuda
