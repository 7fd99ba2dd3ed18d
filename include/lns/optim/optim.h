// AdamW over a ParamSet's flat buffers, the learning-rate schedule and gradient
// clipping. Moments are f32 buffers with the parameters' layout, so a checkpoint or
// a ZeRO shard is a slice of them.
#pragma once
#include <cstdint>

#include "lns/model/param_set.h"

namespace lns {

struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled; applied to matrices only (ParamInfo::decays)
};

class AdamW {
 public:
  // Updates the flat range [begin, end) of the parameters (all of them by default; a
  // data-parallel shard under ZeRO), with moments for that range only.
  AdamW(ParamSet& params, AdamWConfig cfg, int64_t begin = 0, int64_t end = -1);
  // One update with learning rate lr from params.grad(); increments step().
  void step(float lr);
  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }
  // Moments of the range [begin(), end()), laid out as the flat parameter buffer, on
  // the host (checkpoints read and write these). On CUDA they are mirrors of the
  // device moments: download() before reading them, upload() after writing them.
  Tensor exp_avg() const { return (hm_.data() ? hm_ : m_).f32(Shape{end_ - begin_}); }
  Tensor exp_avg_sq() const { return (hv_.data() ? hv_ : v_).f32(Shape{end_ - begin_}); }
  void download();
  void upload();
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }
  const AdamWConfig& config() const { return cfg_; }

 private:
  ParamSet& params_;
  AdamWConfig cfg_;
  int64_t begin_, end_;
  Buffer m_, v_;    // on the parameters' device
  Buffer hm_, hv_;  // host mirrors (CUDA only)
  int64_t t_ = 0;
};

// Linear warm-up to max_lr over `warmup` steps, then cosine decay to
// max_lr * min_lr_ratio at step `total`:
//   lr(s) = max_lr * (s + 1) / warmup                          s < warmup
//   lr(s) = min + (max - min) * (1 + cos(pi * p)) / 2,  p = (s - warmup) / (total - warmup)
// and min afterwards. s is the 0-based index of the optimizer step being taken.
struct LrSchedule {
  double max_lr = 1e-3, min_lr_ratio = 0.1;
  int64_t warmup = 0, total = 1;
  double at(int64_t step) const;
};

// Gradient clipping (torch.nn.utils.clip_grad_norm_): the factor to scale every
// gradient by, max_norm / (norm + 1e-6) when max_norm > 0 and norm > max_norm, else 1.
// The norm is GradientSync::global_norm (every parameter counted once across ranks),
// and GradientSync::scale applies the factor.
float clip_factor(double norm, double max_norm);

}  // namespace lns
