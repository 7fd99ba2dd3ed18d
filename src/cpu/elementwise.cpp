#include "cpu/check.h"
#include "lns/ops.h"

namespace lns {

void axpby(Tensor y, float a, Tensor x, float b) {
  cpu::require_cpu({&y, &x});
  LNS_CHECK(y.numel() == x.numel());
  float* yp = y.f32();
  const float* xp = x.f32();
  const int64_t n = y.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) yp[i] = a * yp[i] + b * xp[i];
}

}  // namespace lns
