// The FP8 recipes (--fp8): how the scale of each FP8 cast is chosen (issue 30). The
// formats and the scaled cast itself are lns/core/fp8_format.h's; what a linear layer
// computes with the scales, lns/core/fp8_linear.h's.
//
// --fp8=delayed: per-tensor scaling, as Transformer Engine defines its DelayedScaling
// recipe: each FP8 tensor keeps the amax (largest |x|) of its last `history` casts; the
// scale for the next cast is
//     scale = fp8_max(format) / amax_h / 2^margin,   amax_h = max of the history
// (or its most recent entry), so that the largest recent value lands `margin` binades
// below the format's largest finite one. An amax of 0 or one that is not finite leaves
// the scale as it was (a step with no signal or an overflow must not zero or poison it).
// The state is a few floats per tensor and goes into checkpoints (state() /
// restore()), so a resumed run casts with the same scales.
//
// --fp8=blockwise: DeepSeek-V3's fine-grained scaling, tiles instead of tensors, each
// scaled from its own amax at the moment of the cast (no history): every GEMM operand is
// cut into tiles of kFp8Tile values along the GEMM's reduction dimension K (1 x 128 for
// activations and gradients, K-major) or 128 x 128 (weights), and tile t is cast with the
// power of two s_t = 2^floor(log2(fp8_max / amax_t)) (fp8_pow2_scale), so the tile's
// largest value lands in the format's top binade and nothing saturates. A power-of-two
// scale makes the unscaling exact.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "lns/core/fp8_format.h"

namespace lns {

// --fp8: none (bf16/f32 GEMMs), delayed or blockwise (above).
enum class Fp8Mode { None, Delayed, Blockwise };
const char* fp8_mode_name(Fp8Mode m);  // "none", "delayed", "blockwise"
// UserError naming `flag` and the accepted values.
Fp8Mode parse_fp8_mode(const std::string& s, const std::string& flag = "--fp8");

// ---- delayed ----------------------------------------------------------------------

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

// ---- blockwise --------------------------------------------------------------------

// The tile edge (values along K per scale; weights' tiles are square).
constexpr int64_t kFp8Tile = 128;

// A tile's scale, on the bits so that host and kernels share it: the largest power of two
// s with amax s <= fp8_max, i.e. 2^(em - ea) less one where the mantissa of amax exceeds
// the maximum's, within f32's normal range; 1 for an amax of 0 or one that is not finite;
// 2^127 for a subnormal amax.
LNS_HOST_DEVICE inline float fp8_pow2_scale(float amax, Fp8Format f) {
  uint32_t ua, um, us;
  const float mx = f == Fp8Format::E4M3 ? 448.0f : 57344.0f;
#if defined(__CUDA_ARCH__)
  ua = __float_as_uint(amax), um = __float_as_uint(mx);
#else
  std::memcpy(&ua, &amax, 4), std::memcpy(&um, &mx, 4);
#endif
  ua &= 0x7FFFFFFFu;
  if (ua == 0 || ua >= 0x7F800000u) return 1.0f;
  int e = 127;  // a subnormal amax: the largest scale there is
  if (ua >> 23) {
    e = static_cast<int>(um >> 23) - static_cast<int>(ua >> 23) - ((um & 0x7FFFFFu) < (ua & 0x7FFFFFu) ? 1 : 0);
    e = e < -126 ? -126 : e > 127 ? 127 : e;
  }
  us = static_cast<uint32_t>(e + 127) << 23;
  float s;
#if defined(__CUDA_ARCH__)
  s = __uint_as_float(us);
#else
  std::memcpy(&s, &us, 4);
#endif
  return s;
}

}  // namespace lns
