#include <cmath>

#include "cpu/check.h"
#include "lns/ops.h"

namespace lns {
namespace {

// max and log(sum(exp(x - max))) of one row, in double.
inline void row_lse(const float* x, int64_t V, float* mx_out, double* lse_out) {
  float mx = x[0];
  for (int64_t j = 1; j < V; ++j) mx = std::max(mx, x[j]);
  double s = 0.0;
  for (int64_t j = 0; j < V; ++j) s += std::exp(static_cast<double>(x[j] - mx));
  *mx_out = mx;
  *lse_out = std::log(s);
}

}  // namespace

void cross_entropy_forward(Tensor losses, Tensor logits, Tensor targets) {
  cpu::require_cpu({&losses, &logits, &targets});
  const int64_t N = cpu::rows_of(logits), V = cpu::cols_of(logits);
  LNS_CHECK(losses.numel() == N && targets.numel() == N);
  for (int64_t n = 0; n < N; ++n) {
    const int32_t t = targets.i32()[n];
    LNS_CHECK(t == kIgnoreIndex || (t >= 0 && t < V)) << "target " << t << " outside [0, " << V << ")";
  }
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const int32_t t = targets.i32()[n];
    if (t == kIgnoreIndex) {
      losses.f32()[n] = 0.0f;
      continue;
    }
    const float* x = logits.f32() + n * V;
    float mx;
    double lse;
    row_lse(x, V, &mx, &lse);
    losses.f32()[n] = static_cast<float>(lse + mx - x[t]);
  }
}

void cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor targets, float grad_scale) {
  cpu::require_cpu({&dlogits, &logits, &targets});
  const int64_t N = cpu::rows_of(logits), V = cpu::cols_of(logits);
  LNS_CHECK(dlogits.numel() == N * V);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const int32_t t = targets.i32()[n];
    const float* x = logits.f32() + n * V;
    float* dx = dlogits.f32() + n * V;
    if (t == kIgnoreIndex) {
      for (int64_t j = 0; j < V; ++j) dx[j] = 0.0f;
      continue;
    }
    float mx;
    double lse;
    row_lse(x, V, &mx, &lse);
    for (int64_t j = 0; j < V; ++j)
      dx[j] = grad_scale * static_cast<float>(std::exp(static_cast<double>(x[j] - mx) - lse));
    dx[t] -= grad_scale;
  }
}

}  // namespace lns
