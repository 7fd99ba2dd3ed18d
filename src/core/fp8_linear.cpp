// --fp8's modes (include/lns/fp8_linear.h); the ops are in src/cpu/linear_fp8.cpp.
#include "lns/fp8_linear.h"

#include "lns/errors.h"

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
  if (s == "blockwise")
    fail(flag, "=blockwise: DeepSeek-V3's 1x128 / 128x128 tile scaling is not built yet; use ", flag,
         "=delayed (per-tensor scales) or ", flag, "=none");
  fail(flag, "=", s, ": expected none or delayed (blockwise is not built yet)");
}

}  // namespace lns
