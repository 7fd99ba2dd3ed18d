// --fp8's modes, the FP8 table's rows and the one-linear ops as groups of one
// (include/lns/core/fp8_linear.h); the ops are in src/cpu/linear_fp8.cpp and
// src/cuda/linear_fp8.cpp.
#include "lns/core/fp8_linear.h"

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

float* Fp8Linear::row(int64_t r) const {
  LNS_CHECK(table.dtype == DType::F32 && table.shape.ndim == 2 && table.dim(1) == kFp8Fields && r >= 0 &&
            r < table.dim(0))
      << "fp8 table " << table.shape.str() << " row " << r;
  return table.f32() + r * kFp8Fields;
}

void check_fp8_shared(size_t n_out, size_t n_w, const std::vector<Fp8Linear>& fs) {
  LNS_CHECK(!fs.empty() && n_out == fs.size() && n_w == fs.size())
      << "fp8 shared linears: " << n_out << " outputs, " << n_w << " weights, " << fs.size() << " linears";
  for (const Fp8Linear& f : fs)
    LNS_CHECK(f.table.data == fs[0].table.data && f.x == fs[0].x && f.blockwise == fs[0].blockwise)
        << "fp8 shared linears must cast x alike: x rows " << fs[0].x << " and " << f.x;
}

void linear_forward_fp8(Tensor y, Tensor x, Tensor w, const Fp8Linear& f) {
  linear_forward_fp8_shared({y}, x, {w}, {f});
}

void linear_backward_fp8(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, bool accumulate_dx,
                         const Fp8Linear& f) {
  linear_backward_fp8_shared(dx, {dw}, {dy}, x, {w}, accumulate_dx, {f});
}

Fp8Mode parse_fp8_mode(const std::string& s, const std::string& flag) {
  if (s == "none") return Fp8Mode::None;
  if (s == "delayed") return Fp8Mode::Delayed;
  if (s == "blockwise") return Fp8Mode::Blockwise;
  fail(flag, "=", s, ": expected none, delayed or blockwise");
}


}  // namespace lns
