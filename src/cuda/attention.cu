// Causal self-attention with grouped-query heads on cuBLASLt. CPU reference:
// src/cpu/attention.cpp.
//
// Approach: heads are permuted to [B, H, T, D]; in that layout the G = Hq/Hkv query
// heads that share kv head j are contiguous, so for each (b, j) the scores of all of
// them are one [G*T, D] x [D, T] product, and every step is a strided-batched
// tensor-core GEMM over (b, j). The softmax is a separate row kernel that also writes
// the row log-sum-exp. Only the log-sum-exp [B, Hq, T] is kept for backward, which
// recomputes scores and probabilities. The [G*T, T] score buffers exist for a chunk
// of (b, j) at a time, sized to a fixed budget (kScoreBudget), so memory grows
// linearly in T for the saved state and stays bounded for the scratch. At T = 256
// the score matrices are small and the GEMMs dominate; at T = 2048 the chunk shrinks
// to a few heads. The causal half of each score matrix is computed and discarded
// (2x the attention FLOPs of a fused flash kernel); docs/cuda.md.
#include <algorithm>
#include <cmath>

#include "cuda/common.cuh"
#include "cuda/flash_attention.h"
#include "cuda/gemm.h"
#include "cuda/pool.h"
#include "cuda/sdpa.h"
#include "lns/core/ops.h"

namespace lns::cuda {
namespace {

constexpr size_t kScoreBudget = size_t{256} << 20;  // bytes of score scratch per chunk

// [B,T,H,D] <-> [B,H,T,D]; to_heads = true reads the first layout. Each thread moves
// W consecutive d (one 16-byte vector when D % 8 == 0 and both buffers are aligned).
template <int W>
__global__ void permute_kernel(bf16* dst, const bf16* src, int64_t B, int T, int H, int D, bool to_heads) {
  const int64_t n = B * T * H * D;
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * W; i < n;
       i += int64_t(gridDim.x) * blockDim.x * W) {
    const int d = i % D;
    int64_t r = i / D;
    // i indexes the [B,T,H,D] element (b,t,h,d)
    const int h = r % H;
    r /= H;
    const int t = r % T;
    const int64_t b = r / T;
    const int64_t j = ((b * H + h) * T + t) * D + d;  // the [B,H,T,D] index
    float f[W];
    load<W>(src + (to_heads ? i : j), f);
    store<W>(dst + (to_heads ? j : i), f);  // bf16 -> f32 -> bf16 is exact
  }
}

void permute(bf16* dst, const bf16* src, int64_t B, int T, int H, int D, bool to_heads) {
  const int64_t n = B * T * H * D;
  if (n == 0) return;
  const bool vec = vec_ok(dst, D) && vec_ok(src, D);
  const int W = vec ? kVec : 1;
  const int grid = static_cast<int>(std::min<int64_t>(ceil_div(n / W, 256), 8192));
  if (vec)
    LNS_LAUNCH(permute_kernel<kVec>, grid, 256, 0, stream())(dst, src, B, T, H, D, to_heads);
  else
    LNS_LAUNCH(permute_kernel<1>, grid, 256, 0, stream())(dst, src, B, T, H, D, to_heads);
  LNS_CUDA_LAUNCHED();
}

// One block per score row r of [rows, T] (t = r % T is the query position): causal
// softmax of the (already scaled) scores. Writes P (bf16, 0 above the diagonal) and
// lse[r] = max + log(sum).
__global__ void softmax_kernel(bf16* P, float* lse, const float* S, int T) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const int t = r % T;
  const float* s = S + r * T;
  float m = -INFINITY;
  for (int j = threadIdx.x; j <= t; j += blockDim.x) m = fmaxf(m, s[j]);
  m = block_max(m, red);
  float sum = 0.0f;
  for (int j = threadIdx.x; j <= t; j += blockDim.x) sum += __expf(s[j] - m);
  sum = block_sum(sum, red);
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < T; j += blockDim.x) P[r * T + j] = to_bf(j <= t ? __expf(s[j] - m) * inv : 0.0f);
  if (threadIdx.x == 0) lse[r] = m + logf(sum);
}

// Backward, per row: P = exp(S - lse) (recomputed), dS = P * (dP - sum_j P dP).
// S holds the scores on entry; dP the gradient of P. Writes P and dS (bf16). Above
// the diagonal (j > t) both are 0: S and dP there are never read (half the traffic).
__global__ void softmax_backward_kernel(bf16* P, bf16* dS, const float* S, const float* dP,
                                        const float* lse, int T) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const int t = r % T;
  const float l = lse[r];
  float dot = 0.0f;
  for (int j = threadIdx.x; j <= t; j += blockDim.x) dot += __expf(S[r * T + j] - l) * dP[r * T + j];
  dot = block_sum(dot, red);
  for (int j = threadIdx.x; j < T; j += blockDim.x) {
    float p = 0.0f, ds = 0.0f;
    if (j <= t) {
      p = __expf(S[r * T + j] - l);
      ds = p * (dP[r * T + j] - dot);
    }
    P[r * T + j] = to_bf(p);
    dS[r * T + j] = to_bf(ds);
  }
}

struct Dims {
  int64_t B;
  int T, Hq, Hkv, D, G;
  int64_t entries() const { return B * Hkv; }           // (b, kv head) pairs
  float scale() const { return 1.0f / std::sqrt(float(D)); }
  int64_t rows() const { return int64_t(G) * T; }        // score rows per entry
  int64_t q_elems() const { return B * T * int64_t(Hq) * D; }
  int64_t kv_elems() const { return B * T * int64_t(Hkv) * D; }
  int64_t chunk() const {  // entries per pass within the score budget (backward: S, dP f32; P, dS bf16)
    const int64_t per = rows() * T * (4 + 4 + 2 + 2);
    return std::max<int64_t>(1, std::min<int64_t>(entries(), int64_t(kScoreBudget) / per));
  }
};

// Start of each scratch sub-buffer: 256-byte aligned, as cuBLASLt likes its operands.
size_t carved(int64_t bytes) { return (bytes + 255) / 256 * 256; }
template <typename T>
T* carve(char*& at, int64_t count) {
  T* p = reinterpret_cast<T*>(at);
  at += carved(count * int64_t(sizeof(T)));
  pool_gap(p + count, at - reinterpret_cast<char*>(p + count), stream());  // alignment padding: untouchable
  return p;
}

Dims dims_of(const Tensor& q, const Tensor& k) {
  LNS_CHECK(q.shape.ndim == 4 && k.shape.ndim == 4);
  Dims d{q.dim(0), int(q.dim(1)), int(q.dim(2)), int(k.dim(2)), int(q.dim(3)), 0};
  LNS_CHECK(d.Hq % d.Hkv == 0 && k.dim(3) == d.D && k.dim(1) == d.T);
  d.G = d.Hq / d.Hkv;
  return d;
}

// q, k, v [B,T,H,D] -> qh [B,Hq,T,D], kh, vh [B,Hkv,T,D]
void to_heads(const Dims& d, bf16* qh, bf16* kh, bf16* vh, const Tensor& q, const Tensor& k, const Tensor& v) {
  permute(qh, ptr<bf16>(q), d.B, d.T, d.Hq, d.D, true);
  permute(kh, ptr<bf16>(k), d.B, d.T, d.Hkv, d.D, true);
  permute(vh, ptr<bf16>(v), d.B, d.T, d.Hkv, d.D, true);
}

// The score GEMM of entries [e0, e0 + n): S = scale * Q K^T, [G*T, T] per entry.
void scores(const Dims& d, float* S, const bf16* qh, const bf16* kh, int64_t e0, int64_t n) {
  const float scale = d.scale();
  GemmArgs g;
  g.M = d.rows(), g.N = d.T, g.K = d.D;
  g.A = qh + e0 * d.rows() * d.D, g.lda = d.D, g.stride_a = d.rows() * d.D;
  g.B = kh + e0 * int64_t(d.T) * d.D, g.ldb = d.D, g.trans_b = true, g.stride_b = int64_t(d.T) * d.D;
  g.C = S, g.ldc = d.T, g.c_dtype = DType::F32, g.stride_c = d.rows() * d.T;
  g.alpha = scale, g.batch = static_cast<int>(n);
  gemm(g);
}

// C[e] = alpha * op(A[e]) @ op(B[e]) over n entries (bf16 output), for the P/dS products.
void batched(int64_t M, int64_t N, int64_t K, const bf16* A, int64_t lda, int64_t sa, bool ta,
             const bf16* B, int64_t ldb, int64_t sb, bf16* C, int64_t ldc, int64_t sc, int64_t n,
             float alpha) {
  GemmArgs g;
  g.M = M, g.N = N, g.K = K;
  g.A = A, g.lda = lda, g.stride_a = sa, g.trans_a = ta;
  g.B = B, g.ldb = ldb, g.stride_b = sb;
  g.C = C, g.ldc = ldc, g.stride_c = sc, g.c_dtype = DType::BF16;
  g.alpha = alpha, g.batch = static_cast<int>(n);
  gemm(g);
}

// cuDNN's attention (AttentionImpl::Cudnn) over the same tensors: the description
// src/cuda/sdpa.h asks for. Alignment and the head dims are the library's to refuse.
SdpaProblem sdpa_problem(const Dims& d, AttentionImpl impl) {
  return SdpaProblem{d.B, d.T, d.Hq, d.Hkv, d.D, d.scale(), impl == AttentionImpl::Cudnn};
}
const uint16_t* bits(const Tensor& t) { return static_cast<const uint16_t*>(t.data); }
uint16_t* bits_out(Tensor& t) { return static_cast<uint16_t*>(t.data); }

}  // namespace

void attention_forward(Tensor out, Tensor saved, Tensor q, Tensor k, Tensor v, AttentionImpl impl) {
  LNS_CHECK(impl != AttentionImpl::Auto) << "attention: resolve Auto with choose_attention_impl()";
  if (impl == AttentionImpl::Fused) return flash_attention_forward(out, saved, q, k, v);
  if (is_cudnn(impl)) {
    for (const Tensor* t : {&q, &k, &v, &out}) expect(*t, DType::BF16, "attention tensor");
    expect(saved, DType::F32, "attention lse");
    const Dims d = dims_of(q, k);
    LNS_CHECK(v.shape == k.shape && out.numel() == q.numel() && saved.numel() == d.B * d.Hq * d.T);
    if (d.B == 0 || d.T == 0) return;
    return sdpa_forward(sdpa_problem(d, impl), SdpaForward{bits_out(out), ptr<float>(saved), bits(q), bits(k), bits(v)},
                        stream());
  }
  expect(q, DType::BF16, "attention q");
  expect(k, DType::BF16, "attention k");
  expect(v, DType::BF16, "attention v");
  expect(out, DType::BF16, "attention out");
  expect(saved, DType::F32, "attention lse");
  const Dims d = dims_of(q, k);
  LNS_CHECK(v.shape == k.shape);
  LNS_CHECK(saved.numel() == d.B * d.Hq * d.T && out.numel() == q.numel());
  if (d.B == 0) return;
  const int64_t ch = d.chunk(), score = d.rows() * d.T;
  // scratch: qh, oh [B,Hq,T,D]; kh, vh [B,Hkv,T,D]; S f32 and P bf16 per chunk
  const size_t bytes = 2 * carved(d.q_elems() * 2) + 2 * carved(d.kv_elems() * 2) + carved(ch * score * 4) +
                       carved(ch * score * 2);
  char* at = static_cast<char*>(scratch(Scratch::Attention, bytes));
  bf16 *qh = carve<bf16>(at, d.q_elems()), *oh = carve<bf16>(at, d.q_elems());
  bf16 *kh = carve<bf16>(at, d.kv_elems()), *vh = carve<bf16>(at, d.kv_elems());
  float* S = carve<float>(at, ch * score);
  bf16* P = carve<bf16>(at, ch * score);
  to_heads(d, qh, kh, vh, q, k, v);
  for (int64_t e0 = 0; e0 < d.entries(); e0 += ch) {
    const int64_t n = std::min(ch, d.entries() - e0);
    scores(d, S, qh, kh, e0, n);
    LNS_LAUNCH(softmax_kernel, n * d.rows(), 128, 0, stream())(P, ptr<float>(saved) + e0 * d.rows(), S, d.T);
    LNS_CUDA_LAUNCHED();
    // O[e] = P[e] [G*T, T] @ V[e] [T, D]
    batched(d.rows(), d.D, d.T, P, d.T, score, false, vh + e0 * int64_t(d.T) * d.D, d.D, int64_t(d.T) * d.D,
            oh + e0 * d.rows() * d.D, d.D, d.rows() * d.D, n, 1.0f);
  }
  permute(ptr<bf16>(out), oh, d.B, d.T, d.Hq, d.D, false);
}

void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor saved, Tensor q, Tensor k,
                        Tensor v, Tensor out, AttentionImpl impl) {
  LNS_CHECK(impl != AttentionImpl::Auto) << "attention: resolve Auto with choose_attention_impl()";
  if (impl == AttentionImpl::Fused) return flash_attention_backward(dq, dk, dv, dout, saved, q, k, v, out);
  if (is_cudnn(impl)) {
    for (const Tensor* t : {&dq, &dk, &dv, &dout, &q, &k, &v, &out}) expect(*t, DType::BF16, "attention tensor");
    expect(saved, DType::F32, "attention lse");
    const Dims d = dims_of(q, k);
    LNS_CHECK(dq.numel() == q.numel() && dk.numel() == k.numel() && dv.numel() == v.numel() &&
              dout.numel() == q.numel() && out.numel() == q.numel() && saved.numel() == d.B * d.Hq * d.T);
    if (d.B == 0 || d.T == 0) return;
    return sdpa_backward(sdpa_problem(d, impl),
                         SdpaBackward{bits_out(dq), bits_out(dk), bits_out(dv), bits(q), bits(k), bits(v), bits(out),
                                      bits(dout), ptr<float>(saved)},
                         stream());
  }
  expect(dout, DType::BF16, "attention dout");
  expect(saved, DType::F32, "attention lse");
  for (const Tensor* t : {&dq, &dk, &dv, &q, &k, &v}) expect(*t, DType::BF16, "attention tensor");
  const Dims d = dims_of(q, k);
  LNS_CHECK(dq.numel() == q.numel() && dk.numel() == k.numel() && dv.numel() == v.numel() && dout.numel() == q.numel() &&
            saved.numel() == d.B * d.Hq * d.T);
  if (d.B == 0) return;
  const int64_t ch = d.chunk(), score = d.rows() * d.T, kvs = int64_t(d.T) * d.D, qs = d.rows() * d.D;
  // scratch: qh, doh, dqh [B,Hq,T,D]; kh, vh, dkh, dvh [B,Hkv,T,D]; S/dP f32, P, dS bf16
  const size_t bytes = 3 * carved(d.q_elems() * 2) + 4 * carved(d.kv_elems() * 2) + 2 * carved(ch * score * 4) +
                       2 * carved(ch * score * 2);
  char* at = static_cast<char*>(scratch(Scratch::Attention, bytes));
  bf16 *qh = carve<bf16>(at, d.q_elems()), *doh = carve<bf16>(at, d.q_elems()), *dqh = carve<bf16>(at, d.q_elems());
  bf16 *kh = carve<bf16>(at, d.kv_elems()), *vh = carve<bf16>(at, d.kv_elems());
  bf16 *dkh = carve<bf16>(at, d.kv_elems()), *dvh = carve<bf16>(at, d.kv_elems());
  float *S = carve<float>(at, ch * score), *dP = carve<float>(at, ch * score);
  bf16 *P = carve<bf16>(at, ch * score), *dS = carve<bf16>(at, ch * score);
  to_heads(d, qh, kh, vh, q, k, v);
  permute(doh, ptr<bf16>(dout), d.B, d.T, d.Hq, d.D, true);
  const float scale = d.scale();
  for (int64_t e0 = 0; e0 < d.entries(); e0 += ch) {
    const int64_t n = std::min(ch, d.entries() - e0);
    scores(d, S, qh, kh, e0, n);
    {  // dP[e] = dO[e] [G*T, D] @ V[e]^T  (f32)
      GemmArgs g;
      g.M = d.rows(), g.N = d.T, g.K = d.D;
      g.A = doh + e0 * qs, g.lda = d.D, g.stride_a = qs;
      g.B = vh + e0 * kvs, g.ldb = d.D, g.trans_b = true, g.stride_b = kvs;
      g.C = dP, g.ldc = d.T, g.c_dtype = DType::F32, g.stride_c = score;
      g.batch = static_cast<int>(n);
      gemm(g);
    }
    LNS_LAUNCH(softmax_backward_kernel, n * d.rows(), 128, 0, stream())(P, dS, S, dP, ptr<float>(saved) + e0 * d.rows(), d.T);
    LNS_CUDA_LAUNCHED();
    // dV[e] [T, D] = P[e]^T @ dO[e]: the sum over the group's query heads comes free
    batched(d.T, d.D, d.rows(), P, d.T, score, true, doh + e0 * qs, d.D, qs, dvh + e0 * kvs, d.D, kvs, n, 1.0f);
    // dQ[e] [G*T, D] = scale * dS[e] @ K[e]
    batched(d.rows(), d.D, d.T, dS, d.T, score, false, kh + e0 * kvs, d.D, kvs, dqh + e0 * qs, d.D, qs, n, scale);
    // dK[e] [T, D] = scale * dS[e]^T @ Q[e]
    batched(d.T, d.D, d.rows(), dS, d.T, score, true, qh + e0 * qs, d.D, qs, dkh + e0 * kvs, d.D, kvs, n, scale);
  }
  permute(ptr<bf16>(dq), dqh, d.B, d.T, d.Hq, d.D, false);
  permute(ptr<bf16>(dk), dkh, d.B, d.T, d.Hkv, d.D, false);
  permute(ptr<bf16>(dv), dvh, d.B, d.T, d.Hkv, d.D, false);
}

// This file's ops on CUDA (lns/core/op_table.h).
LNS_REGISTER_OPS(Device::CUDA) {
  LNS_REGISTER_OP(attention_forward, cuda::attention_forward);
  LNS_REGISTER_OP(attention_backward, cuda::attention_backward);
}

}  // namespace lns::cuda
