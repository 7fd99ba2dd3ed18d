// Attention of a few new queries over a key/value cache (lns/core/ops.h: attention_decode),
// the CPU reference: plain loops, one task per (query, head). Generation runs one query
// at a time, where a GEMM would have one row.
#include <cmath>

#include "cpu/check.h"
#include "lns/core/ops.h"

namespace lns {

namespace cpu {

void attention_decode(Tensor out, Tensor scores, Tensor q, Tensor kcache, Tensor vcache, int64_t pos) {
  cpu::require_cpu({&out, &scores, &q, &kcache, &vcache});
  LNS_CHECK(q.shape.ndim == 3 && kcache.shape.ndim == 3 && out.numel() == q.numel() &&
            vcache.shape == kcache.shape);
  const int64_t n = q.dim(0), Hq = q.dim(1), D = q.dim(2), Tmax = kcache.dim(0), Hkv = kcache.dim(1);
  LNS_CHECK(kcache.dim(2) == D && Hq % Hkv == 0 && pos >= 0 && pos + n <= Tmax && scores.numel() == n * Hq * Tmax);
  const int64_t group = Hq / Hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const float *kc = kcache.f32(), *vc = vcache.f32();
#pragma omp parallel for schedule(static)
  for (int64_t ih = 0; ih < n * Hq; ++ih) {
    const int64_t i = ih / Hq, h = ih % Hq, g = h / group, len = pos + i + 1;
    const float* qh = q.f32() + ih * D;  // [D]
    float* s = scores.f32() + ih * Tmax;  // [len] used
    float mx = -INFINITY;
    for (int64_t j = 0; j < len; ++j) {
      const float* kj = kc + (j * Hkv + g) * D;
      float dot = 0.0f;
      for (int64_t d = 0; d < D; ++d) dot += qh[d] * kj[d];
      s[j] = dot * scale;
      mx = std::max(mx, s[j]);
    }
    double sum = 0.0;
    for (int64_t j = 0; j < len; ++j) {
      s[j] = std::exp(s[j] - mx);
      sum += s[j];
    }
    const float inv = static_cast<float>(1.0 / sum);
    float* o = out.f32() + ih * D;  // [D]
    for (int64_t d = 0; d < D; ++d) o[d] = 0.0f;
    for (int64_t j = 0; j < len; ++j) {
      s[j] *= inv;
      const float* vj = vc + (j * Hkv + g) * D;
      for (int64_t d = 0; d < D; ++d) o[d] += s[j] * vj[d];
    }
  }
}

}  // namespace cpu

LNS_REGISTER_OPS(Device::CPU) { LNS_REGISTER_OP(attention_decode, cpu::attention_decode); }

}  // namespace lns
