#include <cmath>

#include "lns/errors.h"
#include "lns/ops.h"
#include "lns/optim.h"

namespace lns {

AdamW::AdamW(ParamSet& params, AdamWConfig cfg)
    : params_(params), cfg_(cfg), m_(params.numel() * sizeof(float)),
      v_(params.numel() * sizeof(float)) {}

void AdamW::step(float lr) {
  ++t_;
  AdamWHyper h{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, 0.0f,
               static_cast<float>(1.0 - std::pow(double(cfg_.beta1), double(t_))),
               static_cast<float>(1.0 - std::pow(double(cfg_.beta2), double(t_)))};
  const Tensor m = exp_avg(), v = exp_avg_sq();
  for (int i = 0; i < params_.size(); ++i) {
    const ParamInfo& info = params_.info(i);
    h.weight_decay = info.decays() ? cfg_.weight_decay : 0.0f;
    const int64_t n = info.shape.numel();
    const Shape s{n};
    auto slice = [&](Tensor flat) {
      Tensor t = flat;
      t.data = flat.f32() + info.offset;
      t.shape = s;
      return t;
    };
    adamw_step(params_.param(i).view(s), params_.grad(i).view(s), slice(m), slice(v), h);
  }
}

double LrSchedule::at(int64_t step) const {
  const double min_lr = max_lr * min_lr_ratio;
  if (step < warmup) return max_lr * double(step + 1) / double(warmup);
  if (step >= total) return min_lr;
  const double p = double(step - warmup) / double(std::max<int64_t>(1, total - warmup));
  return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * p));
}

double grad_norm(const ParamSet& params) { return std::sqrt(sum_squares(params.flat_grads())); }

float clip_grads(ParamSet& params, double norm, double max_norm) {
  if (max_norm <= 0 || norm <= max_norm) return 1.0f;
  const float f = static_cast<float>(max_norm / (norm + 1e-6));
  scale_inplace(params.flat_grads(), f);
  return f;
}

}  // namespace lns
