// The FP8 table's rows and the one-linear ops as groups of one
// (include/lns/core/fp8_linear.h); the backends' ops are in src/cpu/fp8_linear.cpp and
// src/cuda/fp8_linear.cpp.
#include "lns/core/fp8_linear.h"

#include "lns/core/errors.h"

namespace lns {

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

}  // namespace lns
