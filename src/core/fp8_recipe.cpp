// The FP8 recipes (include/lns/core/fp8_recipe.h): --fp8's modes and delayed per-tensor
// scaling; blockwise's tile scale is inline in the header (host and kernels).
#include "lns/core/fp8_recipe.h"

#include <algorithm>
#include <cmath>

#include "lns/core/errors.h"

namespace lns {

const char* fp8_mode_name(Fp8Mode m) {
  switch (m) {
    case Fp8Mode::None: return "none";
    case Fp8Mode::Delayed: return "delayed";
    case Fp8Mode::Blockwise: return "blockwise";
  }
  return "?";
}

Fp8Mode parse_fp8_mode(const std::string& s, const std::string& flag) {
  if (s == "none") return Fp8Mode::None;
  if (s == "delayed") return Fp8Mode::Delayed;
  if (s == "blockwise") return Fp8Mode::Blockwise;
  fail(flag, "=", s, ": expected none, delayed or blockwise");
}

void Fp8ScalingConfig::validate(const std::string& p) const {
  if (history < 1 || history > (1 << 20)) fail(p, "amax_history=", history, ": expected 1 to 1048576 steps");
  if (margin < 0 || margin > 64) fail(p, "margin=", margin, ": expected 0 to 64 binades");
}

Fp8DelayedScale::Fp8DelayedScale(Fp8Format format, const Fp8ScalingConfig& config)
    : format_(format), config_(config), history_(static_cast<size_t>(config.history), 0.0f) {
  config_.validate();
}

void Fp8DelayedScale::record(float amax) {
  if (!std::isfinite(amax) || amax < 0.0f) amax = 0.0f;  // an overflowed cast counts as no signal
  history_[static_cast<size_t>(next_)] = amax;
  next_ = (next_ + 1) % config_.history;
  filled_ = std::min(filled_ + 1, config_.history);
  const float amax_h = config_.most_recent
                           ? amax
                           : *std::max_element(history_.begin(), history_.begin() + filled_);
  if (!(amax_h > 0.0f)) return;  // nothing seen yet: keep the scale
  const double s = double(fp8_max(format_)) / double(amax_h) / std::ldexp(1.0, config_.margin);
  if (std::isfinite(s) && s > 0.0 && s <= 3.0e38) scale_ = static_cast<float>(s);
}

std::vector<float> Fp8DelayedScale::state() const {
  std::vector<float> s = {scale_, float(filled_), float(next_)};
  s.insert(s.end(), history_.begin(), history_.end());
  return s;
}

void Fp8DelayedScale::restore(const std::vector<float>& s, const std::string& what) {
  const size_t want = 3 + static_cast<size_t>(config_.history);
  if (s.size() != want)
    fail(what, ": FP8 scaling state has ", s.size(), " values, expected ", want, " (3 + --fp8_amax_history=",
         config_.history, ")");
  if (!std::isfinite(s[0]) || !(s[0] > 0.0f)) fail(what, ": FP8 scale ", s[0], " is not a positive finite number");
  const auto whole = [&](float v, int hi, const char* name) {
    if (!(v >= 0.0f && v <= float(hi)) || v != std::floor(v))
      fail(what, ": FP8 scaling state's ", name, " ", v, " is not a whole number in 0..", hi);
    return static_cast<int>(v);
  };
  const int filled = whole(s[1], config_.history, "count"), next = whole(s[2], config_.history - 1, "position");
  for (size_t i = 3; i < s.size(); ++i)
    if (!std::isfinite(s[i]) || s[i] < 0.0f) fail(what, ": FP8 amax history entry ", s[i], " is not finite and >= 0");
  scale_ = s[0], filled_ = filled, next_ = next;
  history_.assign(s.begin() + 3, s.end());
}

}  // namespace lns
