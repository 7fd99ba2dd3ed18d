// Causal self-attention with grouped-query heads, one (batch, head) at a time with
// sgemm on strided head slices. Stores the probabilities [B,Hq,T,T]: on the CPU the
// sequences are short and this keeps the backward two GEMMs per product.
#include <cblas.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/check.h"
#include "lns/core/ops.h"

namespace lns {
namespace {

struct AttnDims {
  int64_t B, T, Hq, Hkv, D, group;
  explicit AttnDims(const Tensor& q, const Tensor& k) {
    LNS_CHECK(q.shape.ndim == 4 && k.shape.ndim == 4);
    B = q.dim(0), T = q.dim(1), Hq = q.dim(2), D = q.dim(3), Hkv = k.dim(2);
    LNS_CHECK(k.dim(0) == B && k.dim(1) == T && k.dim(3) == D && Hq % Hkv == 0);
    group = Hq / Hkv;
  }
};

}  // namespace

namespace cpu {

void attention_forward(Tensor out, Tensor probs, Tensor q, Tensor k, Tensor v, AttentionImpl impl) {
  cpu::require_cpu({&out, &probs, &q, &k, &v});
  const AttnDims d(q, k);
  LNS_CHECK(probs.numel() == d.B * d.Hq * d.T * d.T && out.numel() == q.numel());
  cpu::blas_single_threaded();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.D));
  const int64_t ldq = d.Hq * d.D, ldk = d.Hkv * d.D, T = d.T;
  // One task per (batch, kv head): its query heads write disjoint outputs.
#pragma omp parallel for schedule(static)
  for (int64_t bg = 0; bg < d.B * d.Hkv; ++bg)
    for (int64_t h = (bg % d.Hkv) * d.group; h < (bg % d.Hkv + 1) * d.group; ++h) {
      const int64_t b = bg / d.Hkv, g = bg % d.Hkv;
      const float* qh = q.f32() + b * T * ldq + h * d.D;   // [T,D] stride ldq
      const float* kg = k.f32() + b * T * ldk + g * d.D;   // [T,D] stride ldk
      const float* vg = v.f32() + b * T * ldk + g * d.D;   // [T,D] stride ldk
      float* p = probs.f32() + (b * d.Hq + h) * T * T;     // [T,T]
      float* oh = out.f32() + b * T * ldq + h * d.D;       // [T,D] stride ldq
      // p = scale * qh @ kg^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, d.D, scale, qh, ldq, kg, ldk,
                  0.0f, p, T);
      for (int64_t i = 0; i < T; ++i) {  // causal softmax of row i over j <= i
        float* row = p + i * T;
        float mx = row[0];
        for (int64_t j = 1; j <= i; ++j) mx = std::max(mx, row[j]);
        double sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          row[j] = std::exp(row[j] - mx);
          sum += row[j];
        }
        const float inv = static_cast<float>(1.0 / sum);
        for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
        for (int64_t j = i + 1; j < T; ++j) row[j] = 0.0f;
      }
      // oh = p @ vg
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, d.D, T, 1.0f, p, T, vg, ldk, 0.0f,
                  oh, ldq);
    }
}

void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor probs, Tensor q,
                        Tensor k, Tensor v, Tensor out, AttentionImpl impl) {
  cpu::require_cpu({&dq, &dk, &dv, &dout, &probs, &q, &k, &v});
  const AttnDims d(q, k);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.D));
  const int64_t ldq = d.Hq * d.D, ldk = d.Hkv * d.D, T = d.T;
  cpu::blas_single_threaded();
  std::memset(dk.data, 0, dk.nbytes());
  std::memset(dv.data, 0, dv.nbytes());
  // One task per (batch, kv head): it alone accumulates that kv head's dk, dv.
#pragma omp parallel for schedule(static)
  for (int64_t bg = 0; bg < d.B * d.Hkv; ++bg)
    for (int64_t h = (bg % d.Hkv) * d.group; h < (bg % d.Hkv + 1) * d.group; ++h) {
      const int64_t b = bg / d.Hkv, g = bg % d.Hkv;
      thread_local std::vector<float> dp_buf;
      dp_buf.resize(T * T);
      float* dp = dp_buf.data();  // [T,T]
      const int64_t qoff = b * T * ldq + h * d.D, koff = b * T * ldk + g * d.D;
      const float* p = probs.f32() + (b * d.Hq + h) * T * T;
      const float* doh = dout.f32() + qoff;
      // dp = doh @ vg^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, d.D, 1.0f, doh, ldq,
                  v.f32() + koff, ldk, 0.0f, dp, T);
      // dvg += p^T @ doh
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, d.D, T, 1.0f, p, T, doh, ldq, 1.0f,
                  dv.f32() + koff, ldk);
      // ds = p * (dp - sum_j dp*p) * scale   (zero above the diagonal since p is)
      for (int64_t i = 0; i < T; ++i) {
        double dot = 0.0;
        for (int64_t j = 0; j <= i; ++j) dot += static_cast<double>(dp[i * T + j]) * p[i * T + j];
        for (int64_t j = 0; j < T; ++j)
          dp[i * T + j] = j <= i ? p[i * T + j] * (dp[i * T + j] - static_cast<float>(dot)) * scale
                                 : 0.0f;
      }
      // dqh = ds @ kg ; dkg += ds^T @ qh
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, d.D, T, 1.0f, dp, T,
                  k.f32() + koff, ldk, 0.0f, dq.f32() + qoff, ldq);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, d.D, T, 1.0f, dp, T, q.f32() + qoff,
                  ldq, 1.0f, dk.f32() + koff, ldk);
    }
}

}  // namespace cpu

LNS_REGISTER_OPS(Device::CPU) {
  LNS_REGISTER_OP(attention_forward, cpu::attention_forward);
  LNS_REGISTER_OP(attention_backward, cpu::attention_backward);
}

}  // namespace lns
