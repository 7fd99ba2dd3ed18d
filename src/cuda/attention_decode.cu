// Attention of a few new queries over a key/value cache (lns/core/ops.h: attention_decode),
// for generation. CPU reference: src/cpu/attention_decode.cpp.
//
// One block per (query, head): its threads take the cached keys in turn (scores into
// the f32 scratch row), the block's max and sum (fixed-order reductions), then each
// thread some of the D outputs, summing over the keys in order. Decoding is bound by
// reading the cache once per token, which this does; the one-query shape has no GEMM.
#include "cuda/common.cuh"
#include "lns/core/ops.h"

namespace lns::cuda {
namespace {

constexpr int kMaxHeadDim = 256;
constexpr int kThreads = 128;

__global__ void attention_decode_kernel(bf16* out, float* scores, const bf16* q, const bf16* kc, const bf16* vc,
                                        int Hq, int Hkv, int D, int64_t Tmax, int64_t pos, float scale) {
  __shared__ float red[32];
  __shared__ float qs[kMaxHeadDim];
  const int64_t ih = blockIdx.x;  // query i, head h: row ih of q/out [n*Hq, D]
  const int64_t i = ih / Hq, g = (ih % Hq) / (Hq / Hkv), len = pos + i + 1;
  for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = to_f(q[ih * D + d]);
  __syncthreads();
  float* s = scores + ih * Tmax;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    const bf16* kj = kc + (j * Hkv + g) * D;
    float dot = 0.0f;
    for (int d = 0; d < D; ++d) dot += qs[d] * to_f(kj[d]);
    s[j] = dot * scale;
    m = fmaxf(m, s[j]);
  }
  m = block_max(m, red);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    s[j] = __expf(s[j] - m);
    sum += s[j];
  }
  sum = block_sum(sum, red);  // its barriers also publish every thread's s[j]
  const float inv = 1.0f / sum;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < len; ++j) acc += s[j] * to_f(vc[(j * Hkv + g) * D + d]);
    out[ih * D + d] = to_bf(acc * inv);
  }
}

}  // namespace

void attention_decode(Tensor out, Tensor scores, Tensor q, Tensor kcache, Tensor vcache, int64_t pos) {
  expect(out, DType::BF16, "attention_decode out");
  expect(q, DType::BF16, "attention_decode q");
  expect(kcache, DType::BF16, "attention_decode kcache");
  expect(vcache, DType::BF16, "attention_decode vcache");
  expect(scores, DType::F32, "attention_decode scores");
  LNS_CHECK(q.shape.ndim == 3 && kcache.shape.ndim == 3 && out.numel() == q.numel() &&
            vcache.shape == kcache.shape);
  const int64_t n = q.dim(0), Hq = q.dim(1), D = q.dim(2), Tmax = kcache.dim(0), Hkv = kcache.dim(1);
  LNS_CHECK(kcache.dim(2) == D && Hq % Hkv == 0 && pos >= 0 && pos + n <= Tmax && scores.numel() == n * Hq * Tmax);
  LNS_CHECK(D <= kMaxHeadDim) << "attention_decode: head dim " << D << " > " << kMaxHeadDim;
  if (n == 0) return;
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  LNS_LAUNCH(attention_decode_kernel, static_cast<int>(n * Hq), kThreads, 0, stream())(
      ptr<bf16>(out), ptr<float>(scores), ptr<bf16>(q), ptr<bf16>(kcache), ptr<bf16>(vcache), static_cast<int>(Hq),
      static_cast<int>(Hkv), static_cast<int>(D), Tmax, pos, scale);
  LNS_CUDA_LAUNCHED();
}

}  // namespace lns::cuda

namespace lns {
// This file's op on CUDA (lns/core/op_table.h).
LNS_REGISTER_OPS(Device::CUDA) { LNS_REGISTER_OP(attention_decode, cuda::attention_decode); }
}  // namespace lns
