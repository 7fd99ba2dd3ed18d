// The FP8 cast of the CUDA backend (src/cuda/fp8.cu), for the FP8 linear layers
// (include/lns/core/fp8_linear.h). CPU reference: lns::cast_to_fp8 (src/core/fp8_format.cpp).
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

// --fp8=blockwise's casts (include/lns/core/fp8_linear.h), each tile of 128 along K with its
// own power-of-two scale and its factor 1/s in the layouts of cuda/gemm.h's GemmScale
// (CPU reference: quantize_tiles, src/cpu/fp8_linear.cpp). x, w bf16 viewed as [R, C].
// 1 x 128 along C: q[R,C], s Vec128 for an operand of R rows (K = C); record as fp8_cast.
void fp8_cast_tiles_rows(const Tensor& x, float* row, Fp8Format f, bool record, uint8_t* q, float* s);
// 128 x 1 down R, transposed: qT[C,R], s Vec128 for an operand of C rows (K = R); never recorded.
void fp8_cast_tiles_cols(const Tensor& x, Fp8Format f, uint8_t* qT, float* s);
// 128 x 128: q[R,C] with s Block128 (R rows, K = C), and qT[C,R] with sT Block128 (C rows,
// K = R); either pair may be null.
void fp8_cast_tiles_blocks(const Tensor& w, float* row, Fp8Format f, bool record, uint8_t* q, uint8_t* qT, float* s,
                           float* sT);

}  // namespace lns::cuda
