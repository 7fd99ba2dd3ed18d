// Cross-entropy in vocab-parallel pieces; the single-device ops compose them.
#include <cmath>
#include <vector>

#include "cpu/check.h"
#include "lns/core/ops.h"

namespace lns {

namespace cpu {

void vocab_max_sumexp_target(Tensor rowmax, Tensor sumexp, Tensor target, Tensor logits, Tensor targets,
                             int64_t col_begin, int64_t valid) {
  cpu::require_cpu({&rowmax, &sumexp, &target, &logits, &targets});
  const int64_t N = cpu::rows_of(logits), V = cpu::cols_of(logits);
  LNS_CHECK(rowmax.numel() == N && sumexp.numel() == N && target.numel() == N && targets.numel() == N &&
            valid <= V);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits.f32() + n * V;
    float mx = -INFINITY;
    for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, x[j]);
    double s = 0.0;
    for (int64_t j = 0; j < valid; ++j) s += std::exp(static_cast<double>(x[j] - mx));
    rowmax.f32()[n] = mx;
    sumexp.f32()[n] = static_cast<float>(s);
    const int64_t t = targets.i32()[n] - col_begin;
    target.f32()[n] = targets.i32()[n] != kIgnoreIndex && t >= 0 && t < valid ? x[t] : 0.0f;
  }
}

void vocab_sumexp_rescale(Tensor sumexp, Tensor local_max, Tensor global_max) {
  cpu::require_cpu({&sumexp, &local_max, &global_max});
  const int64_t N = sumexp.numel();
  LNS_CHECK(local_max.numel() == N && global_max.numel() == N);
  for (int64_t n = 0; n < N; ++n) {
    const float lm = local_max.f32()[n];
    sumexp.f32()[n] = lm == -INFINITY ? 0.0f
                                      : static_cast<float>(double(sumexp.f32()[n]) *
                                                           std::exp(double(lm) - double(global_max.f32()[n])));
  }
}

void cross_entropy_combine(Tensor losses, Tensor rowmax, Tensor sumexp, Tensor target,
                           Tensor targets) {
  cpu::require_cpu({&losses, &rowmax, &sumexp, &target, &targets});
  const int64_t N = losses.numel();
  for (int64_t n = 0; n < N; ++n)
    losses.f32()[n] = targets.i32()[n] == kIgnoreIndex
                          ? 0.0f
                          : static_cast<float>(std::log(double(sumexp.f32()[n])) +
                                               rowmax.f32()[n] - target.f32()[n]);
}

void vocab_cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor rowmax, Tensor sumexp,
                                  Tensor targets, int64_t col_begin, int64_t valid,
                                  float grad_scale) {
  cpu::require_cpu({&dlogits, &logits, &rowmax, &sumexp, &targets});
  const int64_t N = cpu::rows_of(logits), V = cpu::cols_of(logits);
  LNS_CHECK(dlogits.numel() == N * V);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const int32_t tg = targets.i32()[n];
    const float* x = logits.f32() + n * V;
    float* dx = dlogits.f32() + n * V;
    if (tg == kIgnoreIndex) {
      for (int64_t j = 0; j < V; ++j) dx[j] = 0.0f;
      continue;
    }
    const float mx = rowmax.f32()[n];
    const double inv = 1.0 / sumexp.f32()[n];
    for (int64_t j = 0; j < valid; ++j)
      dx[j] = grad_scale * static_cast<float>(std::exp(static_cast<double>(x[j] - mx)) * inv);
    for (int64_t j = valid; j < V; ++j) dx[j] = 0.0f;
    const int64_t t = tg - col_begin;
    if (t >= 0 && t < valid) dx[t] -= grad_scale;
  }
}

}  // namespace cpu

namespace {

// Row max, sum of exponentials and target logit of full (single-device) logits.
struct FullVocabStats {
  std::vector<float> mx, se, tl;
  Tensor max, sumexp, target;
  FullVocabStats(Tensor logits, Tensor targets) {
    cpu::require_cpu({&logits, &targets});  // host statistics: the CPU backend only
    const int64_t N = cpu::rows_of(logits), V = cpu::cols_of(logits);
    for (int64_t n = 0; n < targets.numel(); ++n) {
      const int32_t t = targets.i32()[n];
      LNS_CHECK(t == kIgnoreIndex || (t >= 0 && t < V)) << "target " << t << " outside [0, " << V << ")";
    }
    mx.resize(N), se.resize(N), tl.resize(N);
    max = {mx.data(), DType::F32, Device::CPU, Shape{N}};
    sumexp = {se.data(), DType::F32, Device::CPU, Shape{N}};
    target = {tl.data(), DType::F32, Device::CPU, Shape{N}};
    vocab_max_sumexp_target(max, sumexp, target, logits, targets, 0, V);
  }
};

}  // namespace

void cross_entropy_forward(Tensor losses, Tensor logits, Tensor targets) {
  const FullVocabStats st(logits, targets);
  cross_entropy_combine(losses, st.max, st.sumexp, st.target, targets);
}

void cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor targets, float grad_scale) {
  const FullVocabStats st(logits, targets);
  vocab_cross_entropy_backward(dlogits, logits, st.max, st.sumexp, targets, 0, cpu::cols_of(logits), grad_scale);
}


LNS_REGISTER_OPS(Device::CPU) {
  LNS_REGISTER_OP(vocab_max_sumexp_target, cpu::vocab_max_sumexp_target);
  LNS_REGISTER_OP(vocab_sumexp_rescale, cpu::vocab_sumexp_rescale);
  LNS_REGISTER_OP(cross_entropy_combine, cpu::cross_entropy_combine);
  LNS_REGISTER_OP(vocab_cross_entropy_backward, cpu::vocab_cross_entropy_backward);
}

}  // namespace lns
