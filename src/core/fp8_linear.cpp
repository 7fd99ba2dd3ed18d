// --fp8's modes and the FP8 table's rows (include/lns/fp8_linear.h); the ops are in
// src/cpu/linear_fp8.cpp and src/cuda/linear_fp8.cpp.
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

float* Fp8Linear::row(int64_t r) const {
  LNS_CHECK(table.dtype == DType::F32 && table.shape.ndim == 2 && table.dim(1) == kFp8Fields && r >= 0 &&
            r < table.dim(0))
      << "fp8 table " << table.shape.str() << " row " << r;
  return table.f32() + r * kFp8Fields;
}

Fp8Mode parse_fp8_mode(const std::string& s, const std::string& flag) {
  if (s == "none") return Fp8Mode::None;
  if (s == "delayed") return Fp8Mode::Delayed;
  if (s == "blockwise") return Fp8Mode::Blockwise;
  fail(flag, "=", s, ": expected none, delayed or blockwise");
}


}  // namespace lns
