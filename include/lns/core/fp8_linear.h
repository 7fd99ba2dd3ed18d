// The FP8 linear layer of issue 30 (--fp8): what it computes under each recipe
// (lns/core/fp8_recipe.h), the table of scales and health counts its casts share, and
// its ops, which each backend implements (src/cpu/fp8_linear.cpp, the reference, and
// src/cuda/fp8_linear.cpp).
//
// --fp8=delayed, with per-tensor scales sx, sw, sdy (each from that tensor's amax
// history: Fp8DelayedScale) and Q4/Q5 the saturating casts to E4M3/E5M2
// (lns/core/fp8_format.h):
//   forward   y[N,out]   = (Q4(x sx) @ Q4(w sw)^T) / (sx sw)
//   backward  dx[N,in]  (+)= (Q5(dy sdy) @ Q4(w sw)) / (sdy sw)
//             dw[out,in] += (Q5(dy sdy)^T @ Q4(x sx)) / (sdy sx)
// i.e. the GEMMs read 8-bit operands and undo the scales in their epilogue, multiplying
// by (1/sa)(1/sb) as the f32 inverses the table holds (what cuBLASLt's FP8 matmul does
// with its A/B scale pointers), accumulating in f32.
// Forward inputs and weights are E4M3 (more precision), gradients E5M2 (more range),
// as Transformer Engine's HYBRID format.
//
// --fp8=blockwise scales tiles instead of tensors (1 x 128 along the GEMM's reduction
// dimension K for activations and gradients, 128 x 128 for weights, each with its own
// power-of-two scale s_t: the recipe's), and the GEMM multiplies each tile's products by
// 1/s_t (cuBLASLt's VEC128_32F and BLK128x128_32F scale modes):
//   forward   y  = Q4(x; 1x128 along in) @ Q4(w; 128x128)^T
//   backward  dx (+)= Q5(dy; 1x128 along out) @ Q4(w; 128x128)
//             dw += Q5(dy; 128x1 along N)^T @ Q4(x; 128x1 along N)
// with Q the tile-scaled cast already unscaled (value = code / s_t). So dy and x are cast
// twice in the backward, once per direction of K, as Transformer Engine's blockwise
// recipe does. The table's rows then carry only the health (the scale fields stay 1,
// unused).
//
// The scales live in a table on the tensors' device so that a GEMM reads its scale
// where the data is, and every cast adds its tensor's health to the same row; the stage
// turns the table into the next step's scales once per optimizer step (Fp8State).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lns/core/errors.h"
#include "lns/core/fp8_recipe.h"
#include "lns/core/op_table.h"
#include "lns/core/tensor.h"

namespace lns {

// One row per FP8 tensor (a linear's input x, weight w or output gradient dy), f32:
enum Fp8Field : int64_t {
  kFp8ScaleInv = 0,  // 1 / scale in f32: what the GEMM multiplies its product by (cuBLASLt's scale pointer)
  kFp8Scale,       // read by every cast of the tensor (set by the stage between steps)
  kFp8Amax,        // max |value| of the unscaled tensor over this step's casts (non-finite skipped)
  kFp8Saturated,   // values beyond the format's largest finite after scaling, summed
  kFp8Flushed,     // non-zero values that became 0, summed
  kFp8Nonfinite,   // inf/NaN inputs, summed
  kFp8Elements,    // values cast, summed
  kFp8Unused,      // pads a row to 32 bytes (below)
  kFp8Fields
};
// cuBLASLt takes a scale pointer only at a 16-byte boundary: on an H200 (2026-11-28) an
// FP8 matmul with a scale 4, 8 or 12 bytes past one returned CUBLAS_STATUS_NOT_SUPPORTED
// from every algorithm its heuristic offered. So each row's GEMM scale starts it, and
// rows are a multiple of 16 bytes (the table itself is device-allocated, 256-aligned).
static_assert(kFp8ScaleInv == 0 && kFp8Fields * sizeof(float) % 16 == 0, "FP8 GEMM scales 16-byte aligned");
// The counts are f32 sums: exact below 2^24 and within 1e-7 relative above, which is
// what the fractions reported from them need.

// The rows of a table [R, kFp8Fields] f32 that one linear's casts use.
struct Fp8Linear {
  Tensor table;
  int64_t x = -1, w = -1, dy = -1;
  bool blockwise = false;  // --fp8=blockwise: tile scales (above); else the rows' per-tensor scales
  // The weight's operands as fp8_cast_weight left them (its step's codes), read by the
  // ops instead of casting w; empty: the ops cast w at every call (and record it).
  Tensor w_cast{};
  // Row r of the table (checked: an f32 [R, kFp8Fields] table, 0 <= r < R), on its device.
  float* row(int64_t r) const;
};

// Casts record into their rows (amax as a max, counts as sums). The backward casts x
// (and w, without f.w_cast) again with the forward's scales (the same codes) and
// records only dy.
// CPU (src/cpu/fp8_linear.cpp, the reference) and CUDA (src/cuda/fp8_linear.cpp: the
// casts of src/cuda/fp8_cast.cu and fp8_tiles.cu and cuBLASLt's FP8 matmul, which needs
// every GEMM dimension a multiple of 16).
void linear_forward_fp8(Tensor y, Tensor x, Tensor w, const Fp8Linear& f);
void linear_backward_fp8(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, bool accumulate_dx,
                         const Fp8Linear& f);

// Linears that read one input x (a block's q, k and v; its gate and up): x is cast once
// for all of them, forward and backward, and every product reads that cast. So they
// must cast x alike: every fs[i] names the same x row (Fp8State gives a group its first
// linear's x row) of the same table, in the same mode (checked). The ops above are the
// group of one.
//   forward   ys[i] = x @ ws[i]^T
//   backward  dx (+)= sum_i dys[i] @ ws[i] (only the first product overwrites, and only
//             without accumulate_dx; dx may be empty), dws[i] += dys[i]^T @ x
// check_fp8_shared is their precondition (n_out and n_w: the lengths of the other lists),
// checked before either backend runs.
void check_fp8_shared(size_t n_out, size_t n_w, const std::vector<Fp8Linear>& fs);
inline void linear_forward_fp8_shared(const std::vector<Tensor>& ys, Tensor x, const std::vector<Tensor>& ws,
                                      const std::vector<Fp8Linear>& fs) {
  check_fp8_shared(ys.size(), ws.size(), fs);
  LNS_OP(linear_forward_fp8_shared, x.device)(ys, x, ws, fs);
}
inline void linear_backward_fp8_shared(Tensor dx, const std::vector<Tensor>& dws, const std::vector<Tensor>& dys,
                                       Tensor x, const std::vector<Tensor>& ws, bool accumulate_dx,
                                       const std::vector<Fp8Linear>& fs) {
  check_fp8_shared(dws.size(), ws.size(), fs);
  LNS_CHECK(dys.size() == ws.size());
  LNS_OP(linear_backward_fp8_shared, x.device)(dx, dws, dys, x, ws, accumulate_dx, fs);
}

// A weight cast once for a whole optimizer step (Fp8State::begin_step). The weight and
// its scale do not change within a step, so every micro-batch's forward, its recompute
// and its backward would cast w to the same codes: cast once, they read w_cast (w is
// then one pass per step, not two per micro-batch). The cast records w's health once.
// w_cast is f32 [fp8_weight_cast_numel(w, f)] on w's device; what it holds is the
// backend's business: the CPU keeps the codes' f32 values ([out,in], read both ways by
// its GEMMs), CUDA the codes of w and of its transpose (and their tile factors under
// blockwise), each 256-byte aligned (src/cuda/fp8_linear.cpp).
inline int64_t fp8_weight_cast_numel(Tensor w, const Fp8Linear& f) {
  return LNS_OP(fp8_weight_cast_numel, w.device)(w, f);
}
inline void fp8_cast_weight(Tensor w_cast, Tensor w, const Fp8Linear& f) {
  LNS_OP(fp8_cast_weight, w.device)(w_cast, w, f);
}

}  // namespace lns
