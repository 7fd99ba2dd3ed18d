// Vocab-parallel softmax cross-entropy over bf16 logits, statistics in f32. CPU
// reference: src/cpu/cross_entropy.cpp. The backward recomputes softmax from the
// logits and the row statistics and writes the gradient over the logits in place,
// so probabilities are never stored.
#include "cuda/common.cuh"
#include "lns/core/ops.h"

namespace lns::cuda {
namespace {

constexpr int kBlock = 512;

// Row kernels read W columns at a time (W = 8 when rows are 16-byte aligned vectors;
// `valid` need not be a multiple of W: columns >= valid are skipped one by one).
#define LNS_FOR_COLUMNS(j, V, W) for (int64_t j = int64_t(threadIdx.x) * W; j < V; j += int64_t(blockDim.x) * W)

// One pass over a row of logits[N, V] (a block per row): each thread keeps the max m of
// its columns and the sum s of exp(x - m), rescaling s when m grows (once per vector of
// W); then the block takes the max M of the m's and the sum of s * exp(m - M), both in a
// fixed order. rowmax[n] = M, sumexp[n] = that sum, target[n] the target's logit here.
// (Two passes, max then sum, read the 0.5 GB of a 1B micro-batch's logits twice.)
template <int W>
__global__ void max_sumexp_target_kernel(float* rowmax, float* sumexp, float* target, const bf16* logits,
                                         const int32_t* targets, int64_t V, int64_t col_begin, int64_t valid) {
  __shared__ float red[32];
  const bf16* row = logits + blockIdx.x * V;
  float m = -INFINITY, s = 0.0f;
  LNS_FOR_COLUMNS(j, valid, W) {
    float f[W];
    load<W>(row + j, f);  // j < valid <= V and V % W == 0: the vector is inside the row
    float mv = -INFINITY;
#pragma unroll
    for (int k = 0; k < W; ++k)
      if (j + k < valid) mv = fmaxf(mv, f[k]);
    if (mv > m) s *= __expf(m - mv), m = mv;  // m = -inf: s is 0, and exp(-inf) = 0
#pragma unroll
    for (int k = 0; k < W; ++k)
      if (j + k < valid) s += __expf(f[k] - m);
  }
  const float mx = block_max(m, red);
  s = block_sum(m == -INFINITY ? 0.0f : s * __expf(m - mx), red);
  if (threadIdx.x == 0) {
    rowmax[blockIdx.x] = mx;
    sumexp[blockIdx.x] = s;
    const int64_t t = int64_t(targets[blockIdx.x]) - col_begin;
    target[blockIdx.x] = targets[blockIdx.x] != kIgnoreIndex && t >= 0 && t < valid ? to_f(row[t]) : 0.0f;
  }
}

// sumexp[n] *= exp(local[n] - global[n]): a rank's sum to the max over the ranks.   [N]
__global__ void sumexp_rescale_kernel(float* sumexp, const float* local, const float* global, int64_t N) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  sumexp[n] = local[n] == -INFINITY ? 0.0f : sumexp[n] * expf(local[n] - global[n]);  // expf(0) is 1 exactly
}

__global__ void combine_kernel(float* losses, const float* rowmax, const float* sumexp,
                               const float* target, const int32_t* targets, int64_t N) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  losses[n] = targets[n] == kIgnoreIndex ? 0.0f : logf(sumexp[n]) + rowmax[n] - target[n];
}

// dlogits = grad_scale * (softmax - onehot) on valid columns, 0 elsewhere and on
// ignored rows. dlogits may alias logits (each element is read, then written, by
// the same thread).
template <int W>
__global__ void ce_backward_kernel(bf16* dlogits, const bf16* logits, const float* rowmax,
                                   const float* sumexp, const int32_t* targets, int64_t V,
                                   int64_t col_begin, int64_t valid, float grad_scale) {
  const int64_t n = blockIdx.x;
  const int32_t tg = targets[n];
  const float mx = rowmax[n], inv = 1.0f / sumexp[n];
  const int64_t t = tg == kIgnoreIndex ? -1 : int64_t(tg) - col_begin;
  LNS_FOR_COLUMNS(j, V, W) {
    float f[W];
    load<W>(logits + n * V + j, f);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      float d = 0.0f;
      if (tg != kIgnoreIndex && j + k < valid) {
        d = grad_scale * __expf(f[k] - mx) * inv;
        if (j + k == t) d -= grad_scale;
      }
      f[k] = d;
    }
    store<W>(dlogits + n * V + j, f);
  }
}

int64_t rows_of(const Tensor& t) { return t.numel() / t.dim(-1); }

}  // namespace

void vocab_max_sumexp_target(Tensor rowmax, Tensor sumexp, Tensor target, Tensor logits, Tensor targets,
                             int64_t col_begin, int64_t valid) {
  expect(logits, DType::BF16, "logits");
  expect(targets, DType::I32, "targets");
  expect(rowmax, DType::F32, "rowmax");
  expect(sumexp, DType::F32, "sumexp");
  expect(target, DType::F32, "target logit");
  const int64_t N = rows_of(logits);
  LNS_CHECK(valid <= logits.dim(-1) && rowmax.numel() == N && targets.numel() == N && sumexp.numel() == N &&
            target.numel() == N);
  if (N == 0) return;
  auto* fn = vec_ok(logits.data, logits.dim(-1)) ? max_sumexp_target_kernel<kVec> : max_sumexp_target_kernel<1>;
  LNS_LAUNCH(fn, N, kBlock, 0, stream())(ptr<float>(rowmax), ptr<float>(sumexp), ptr<float>(target),
                                         ptr<bf16>(logits), ptr<int32_t>(targets), logits.dim(-1), col_begin, valid);
  LNS_CUDA_LAUNCHED();
}

void vocab_sumexp_rescale(Tensor sumexp, Tensor local_max, Tensor global_max) {
  expect(sumexp, DType::F32, "sumexp");
  expect(local_max, DType::F32, "local max");
  expect(global_max, DType::F32, "global max");
  const int64_t N = sumexp.numel();
  LNS_CHECK(local_max.numel() == N && global_max.numel() == N);
  if (N == 0) return;
  LNS_LAUNCH(sumexp_rescale_kernel, ceil_div(N, 256), 256, 0, stream())(ptr<float>(sumexp), ptr<float>(local_max),
                                                                       ptr<float>(global_max), N);
  LNS_CUDA_LAUNCHED();
}

void cross_entropy_combine(Tensor losses, Tensor rowmax, Tensor sumexp, Tensor target, Tensor targets) {
  expect(losses, DType::F32, "losses");
  expect(targets, DType::I32, "targets");
  const int64_t N = losses.numel();
  if (N == 0) return;
  LNS_LAUNCH(combine_kernel, ceil_div(N, 256), 256, 0, stream())(ptr<float>(losses), ptr<float>(rowmax), ptr<float>(sumexp),
                                                         ptr<float>(target), ptr<int32_t>(targets), N);
  LNS_CUDA_LAUNCHED();
}

void vocab_cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor rowmax, Tensor sumexp, Tensor targets,
                                  int64_t col_begin, int64_t valid, float grad_scale) {
  expect(logits, DType::BF16, "logits");
  expect(dlogits, DType::BF16, "dlogits");
  const int64_t N = rows_of(logits);
  LNS_CHECK(dlogits.numel() == logits.numel() && valid <= logits.dim(-1));
  if (N == 0) return;
  const bool vec = vec_ok(logits.data, logits.dim(-1)) && vec_ok(dlogits.data, logits.dim(-1));
  auto* fn = vec ? ce_backward_kernel<kVec> : ce_backward_kernel<1>;
  LNS_LAUNCH(fn, N, kBlock, 0, stream())(ptr<bf16>(dlogits), ptr<bf16>(logits), ptr<float>(rowmax), ptr<float>(sumexp),
                                 ptr<int32_t>(targets), logits.dim(-1), col_begin, valid, grad_scale);
  LNS_CUDA_LAUNCHED();
}

// This file's ops on CUDA (lns/core/op_table.h).
LNS_REGISTER_OPS(Device::CUDA) {
  LNS_REGISTER_OP(vocab_max_sumexp_target, cuda::vocab_max_sumexp_target);
  LNS_REGISTER_OP(vocab_sumexp_rescale, cuda::vocab_sumexp_rescale);
  LNS_REGISTER_OP(cross_entropy_combine, cuda::cross_entropy_combine);
  LNS_REGISTER_OP(vocab_cross_entropy_backward, cuda::vocab_cross_entropy_backward);
}

}  // namespace lns::cuda
