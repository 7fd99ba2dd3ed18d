#include <cmath>

#include "cpu/check.h"
#include "lns/core/ops.h"

namespace lns {

namespace cpu {

void swiglu_forward(Tensor out, Tensor gate, Tensor up) {
  cpu::require_cpu({&out, &gate, &up});
  const int64_t n = gate.numel();
  LNS_CHECK(up.numel() == n && out.numel() == n);
  const float *g = gate.f32(), *u = up.f32();
  float* o = out.f32();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) {
  cpu::require_cpu({&dgate, &dup, &dout, &gate, &up});
  const int64_t n = gate.numel();
  const float *g = gate.f32(), *u = up.f32(), *d = dout.f32();
  float *dg = dgate.f32(), *du = dup.f32();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float sig = 1.0f / (1.0f + std::exp(-g[i]));
    const float silu = g[i] * sig;
    // d silu/dg = sig * (1 + g * (1 - sig))
    dg[i] = d[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
    du[i] = d[i] * silu;
  }
}

}  // namespace cpu

LNS_REGISTER_OPS(Device::CPU) {
  LNS_REGISTER_OP(swiglu_forward, cpu::swiglu_forward);
  LNS_REGISTER_OP(swiglu_backward, cpu::swiglu_backward);
}

}  // namespace lns
