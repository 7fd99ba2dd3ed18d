// Rotary embedding, half-split layout: pairs (j, j + D/2), as Hugging Face's rotate_half.
#include "cpu/check.h"
#include "lns/core/ops.h"

namespace lns {
namespace {

// x[B,T,H,D] rotated by +angle (forward, sign=+1) or -angle (backward, sign=-1).
void rotate(Tensor x, Tensor cos, Tensor sin, float sign) {
  cpu::require_cpu({&x, &cos, &sin});
  LNS_CHECK(x.shape.ndim == 4);
  const int64_t B = x.dim(0), T = x.dim(1), H = x.dim(2), D = x.dim(3), half = D / 2;
  LNS_CHECK(D % 2 == 0 && cos.dim(0) >= T && cos.dim(1) == half);
  float* p = x.f32();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const float* c = cos.f32() + t * half;
      const float* s = sin.f32() + t * half;
      for (int64_t h = 0; h < H; ++h) {
        float* v = p + ((b * T + t) * H + h) * D;
        for (int64_t j = 0; j < half; ++j) {
          const float a = v[j], bb = v[j + half], sn = sign * s[j];
          v[j] = a * c[j] - bb * sn;
          v[j + half] = bb * c[j] + a * sn;
        }
      }
    }
}

}  // namespace

namespace cpu {

void rope_forward(Tensor x, Tensor cos, Tensor sin) {
  rotate(x, cos, sin, 1.0f);
}
void rope_backward(Tensor dx, Tensor cos, Tensor sin) {
  rotate(dx, cos, sin, -1.0f);
}

}  // namespace cpu

LNS_REGISTER_OPS(Device::CPU) {
  LNS_REGISTER_OP(rope_forward, cpu::rope_forward);
  LNS_REGISTER_OP(rope_backward, cpu::rope_backward);
}

}  // namespace lns
