// Delayed per-tensor scaling for FP8 (issue 30's --fp8=delayed), as Transformer Engine
// defines its DelayedScaling recipe: each FP8 tensor keeps the amax (largest |x|) of its
// last `history` casts; the scale for the next cast is
//     scale = fp8_max(format) / amax_h / 2^margin,   amax_h = max of the history
// (or its most recent entry), so that the largest recent value lands `margin` binades
// below the format's largest finite one. An amax of 0 or one that is not finite leaves
// the scale as it was (a step with no signal or an overflow must not zero or poison it).
// The state is a few floats per tensor and goes into checkpoints (state() /
// restore()), so a resumed run casts with the same scales.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lns/core/fp8.h"

namespace lns {

struct Fp8ScalingConfig {
  int history = 1024;        // amax entries kept (TE's amax_history_len default)
  int margin = 0;            // binades of headroom (TE's margin default)
  bool most_recent = false;  // amax_h = the newest entry instead of the history's max
  // One-line UserError naming the setting when out of range.
  void validate(const std::string& flag_prefix = "--fp8_") const;
};

class Fp8DelayedScale {
 public:
  Fp8DelayedScale(Fp8Format format, const Fp8ScalingConfig& config);
  float scale() const { return scale_; }              // multiply before the cast
  float inverse() const { return 1.0f / scale_; }     // what the GEMM's scale pointer undoes
  // Records the amax of the cast just made with scale() and computes the next scale.
  void record(float amax);
  // The state as floats: [scale, filled, next, history...] and back; restore() checks
  // the length against the config and every value's range (UserError naming `what`).
  std::vector<float> state() const;
  void restore(const std::vector<float>& s, const std::string& what);

 private:
  Fp8Format format_;
  Fp8ScalingConfig config_;
  float scale_ = 1.0f;
  std::vector<float> history_;  // ring buffer
  int next_ = 0, filled_ = 0;
};

}  // namespace lns
