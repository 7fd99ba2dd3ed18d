// Shape and device checks shared by the CPU kernels (programmer errors: CHECK).
#pragma once
#include "lns/errors.h"
#include "lns/tensor.h"

namespace lns::cpu {

inline void require_cpu(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (!t->empty()) LNS_CHECK(t->device == Device::CPU) << "CPU kernel given a CUDA tensor";
}

// Rows and columns of a tensor read as a matrix [numel / last, last].
inline int64_t rows_of(const Tensor& t) { return t.numel() / t.dim(-1); }
inline int64_t cols_of(const Tensor& t) { return t.dim(-1); }

}  // namespace lns::cpu
