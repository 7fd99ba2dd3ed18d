// The per-tensor FP8 cast of the CUDA backend (src/cuda/fp8_cast.cu), for the FP8 linear
// layers (include/lns/core/fp8_linear.h; --fp8=blockwise's tiled casts: cuda/fp8_tiles.h).
// CPU reference: lns::cast_to_fp8 (src/core/fp8_format.cpp).
#pragma once
#include <cstdint>

#include "lns/core/fp8_format.h"
#include "lns/core/tensor.h"

namespace lns::cuda {

// q[R,C] = fp8(x[R,C] * s) and/or qT[C,R] = its transpose (either may be null), with s
// the scale in `row` (a device row of the FP8 table: include/lns/core/fp8_linear.h). With
// record, the cast's amax and saturated/flushed/non-finite counts are merged into the
// row (max and sums over fixed-order per-tile partials: deterministic). x is bf16,
// viewed as [R, C] with C its last dimension.
void fp8_cast(const Tensor& x, float* row, Fp8Format f, bool record, uint8_t* q, uint8_t* qT);

}  // namespace lns::cuda
