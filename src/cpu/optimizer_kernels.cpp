#include <cmath>

#include "cpu/check.h"
#include "lns/core/ops.h"

namespace lns {

namespace cpu {

void adamw_step(Tensor p, Tensor g, Tensor m, Tensor v, const AdamWHyper& h, Tensor p_compute) {
  cpu::require_cpu({&p, &g, &m, &v});
  LNS_CHECK(p_compute.empty()) << "the CPU backend computes with the f32 weights";
  const int64_t n = p.numel();
  LNS_CHECK(g.numel() == n && m.numel() == n && v.numel() == n);
  float *pp = p.f32(), *mp = m.f32(), *vp = v.f32();
  const float* gp = g.f32();
  const float decay = 1.0f - h.lr * h.weight_decay;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    mp[i] = h.beta1 * mp[i] + (1.0f - h.beta1) * gp[i];
    vp[i] = h.beta2 * vp[i] + (1.0f - h.beta2) * gp[i] * gp[i];
    const float mhat = mp[i] / h.bias_correction1;
    const float vhat = vp[i] / h.bias_correction2;
    pp[i] = pp[i] * decay - h.lr * mhat / (std::sqrt(vhat) + h.eps);
  }
}

double sum_squares(Tensor x) {
  cpu::require_cpu({&x});
  const float* p = x.f32();
  double s = 0.0;
  for (int64_t i = 0, n = x.numel(); i < n; ++i) s += double(p[i]) * p[i];
  return s;
}

void scale_inplace(Tensor x, float a) {
  cpu::require_cpu({&x});
  float* p = x.f32();
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] *= a;
}

}  // namespace cpu

LNS_REGISTER_OPS(Device::CPU) {
  LNS_REGISTER_OP(adamw_step, cpu::adamw_step);
  LNS_REGISTER_OP(sum_squares, cpu::sum_squares);
  LNS_REGISTER_OP(scale_inplace, cpu::scale_inplace);
}

}  // namespace lns
