// --fp8=blockwise's FP8 casts of the CUDA backend (src/cuda/fp8_tiles.cu), for the FP8
// linear layers (include/lns/core/fp8_linear.h; the per-tensor cast: cuda/fp8_cast.h).
#pragma once
#include <cstdint>

#include "lns/core/fp8_format.h"
#include "lns/core/tensor.h"

namespace lns::cuda {

// Each tile of 128 along K (include/lns/core/fp8_recipe.h) is cast with its own
// power-of-two scale, its factor 1/s written in the layouts of cuda/gemm.h's GemmScale
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
