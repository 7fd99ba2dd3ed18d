#include <algorithm>
#include <cmath>

#include "lns/core/device.h"
#include "lns/core/errors.h"
#include "lns/core/ops.h"
#include "lns/optim/optim.h"

namespace lns {

AdamW::AdamW(ParamSet& params, AdamWConfig cfg, int64_t begin, int64_t end)
    : params_(params), cfg_(cfg), begin_(begin), end_(end < 0 ? params.numel() : end),
      m_((end_ - begin_) * sizeof(float), params.device()),
      v_((end_ - begin_) * sizeof(float), params.device()) {
  if (params.device() == Device::CUDA) {
    hm_ = Buffer(m_.nbytes());
    hv_ = Buffer(v_.nbytes());
  }
}

void AdamW::download() {
  if (!hm_.data()) return;
  copy_tensor(exp_avg(), m_.f32(Shape{end_ - begin_}));
  copy_tensor(exp_avg_sq(), v_.f32(Shape{end_ - begin_}));
}

void AdamW::upload() {
  if (!hm_.data()) return;
  copy_tensor(m_.f32(Shape{end_ - begin_}), exp_avg());
  copy_tensor(v_.f32(Shape{end_ - begin_}), exp_avg_sq());
}

void AdamW::step(float lr) {
  ++t_;
  AdamWHyper h{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, 0.0f,
               static_cast<float>(1.0 - std::pow(double(cfg_.beta1), double(t_))),
               static_cast<float>(1.0 - std::pow(double(cfg_.beta2), double(t_)))};
  const Tensor m = m_.f32(Shape{end_ - begin_}), v = v_.f32(Shape{end_ - begin_});
  const Tensor p = params_.flat_params(), g = params_.flat_grads(), pc = params_.flat_compute();
  auto slice = [](Tensor flat, int64_t at, int64_t n) { return flat.empty() ? flat : flat.rows(at, at + n); };
  // One call per run of consecutive tensors with the same weight decay (one kernel for
  // the whole buffer without decay, instead of one per tensor). The alignment gaps
  // between tensors hold zeros in p, g, m and v, which an update leaves at zero.
  auto update = [&](int64_t lo, int64_t hi, float wd) {
    h.weight_decay = wd;
    adamw_step(slice(p, lo, hi - lo), slice(g, lo, hi - lo), slice(m, lo - begin_, hi - lo),
               slice(v, lo - begin_, hi - lo), h, slice(pc, lo, hi - lo));
  };
  int64_t run_lo = -1, run_hi = -1;
  float run_wd = 0.0f;
  for (int i = 0; i < params_.size(); ++i) {
    const ParamInfo& info = params_.info(i);
    const int64_t lo = std::max<int64_t>(begin_, info.offset),
                  hi = std::min<int64_t>(end_, info.offset + info.shape.numel());
    if (lo >= hi) continue;
    const float wd = info.decays() ? cfg_.weight_decay : 0.0f;
    if (run_lo >= 0 && wd == run_wd) {
      run_hi = hi;
      continue;
    }
    if (run_lo >= 0) update(run_lo, run_hi, run_wd);
    run_lo = lo, run_hi = hi, run_wd = wd;
  }
  if (run_lo >= 0) update(run_lo, run_hi, run_wd);
}

double LrSchedule::at(int64_t step) const {
  const double min_lr = max_lr * min_lr_ratio;
  if (step < warmup) return max_lr * double(step + 1) / double(warmup);
  if (step >= total) return min_lr;
  const double p = double(step - warmup) / double(std::max<int64_t>(1, total - warmup));
  return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * p));
}

float clip_factor(double norm, double max_norm) {
  if (max_norm <= 0 || norm <= max_norm) return 1.0f;
  return static_cast<float>(max_norm / (norm + 1e-6));
}

}  // namespace lns
