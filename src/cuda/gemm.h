// The cuBLASLt GEMM wrapper: every matrix product of the CUDA backend goes through
// gemm(). Row-major operands as the model sees them (weights [out, in] like
// torch.nn.Linear), bf16 (or FP8) inputs, f32 accumulation, output bf16 or f32 (with beta = 1
// accumulating in place, e.g. weight gradients). Strided batches for attention.
#pragma once
#include <cstdint>

#include "lns/core/tensor.h"

namespace lns::cuda {

// The element type of an input operand: bf16, or FP8 (E4M3, E5M2) with a scale pointer.
// FP8 products are cuBLASLt's FP8 matmul, which takes only `trans_b` operands here (both
// K-major: row-major A[M,K] and B stored [N,K]; cuBLASLt's "TN"), K, M, N and the
// leading dimensions multiples of 16, never two E5M2 operands, and one matrix (no batch).
enum class GemmInput { BF16, E4M3, E5M2 };

// How an FP8 operand's scale pointer is read (cuBLASLt's scale modes): one factor for the
// whole operand, or one per tile of 128 values along K (--fp8=blockwise) for an operand
// of `rows` rows (M for A, N for B) stored K-major:
//   Vec128    1 x 128 tiles: f32 [ceil(K/128)][rows rounded up to 4], a tile row's
//             factors contiguous (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F)
//   Block128  128 x 128 tiles: f32 [ceil(rows/128)][ceil(K/128) rounded up to 4]
//             (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F)
// Both operands block-scaled or neither, and never Block128 on both; the tensors 16-byte
// aligned. The layouts are Transformer Engine's for these modes (its blockwise recipe).
enum class GemmScale { Tensor, Vec128, Block128 };
int64_t gemm_scale_floats(GemmScale s, int64_t rows, int64_t K);  // the scale tensor's length

struct GemmArgs {
  // C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C, all row-major.
  // op(A) = A [M,K] (lda >= K) or, with trans_a, A^T of A stored [K,M] (lda >= M);
  // op(B) = B [K,N] (ldb >= N) or, with trans_b, B^T of B stored [N,K] (ldb >= K).
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  const void* A = nullptr;  // bf16
  int64_t lda = 0;
  const void* B = nullptr;  // bf16
  int64_t ldb = 0;
  void* C = nullptr;
  int64_t ldc = 0;
  DType c_dtype = DType::BF16;  // BF16 or F32
  float alpha = 1.0f, beta = 0.0f;
  // Strided batch: matrix i of A starts at A + i * stride_a elements, etc.
  int batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  // FP8 inputs: their types and device pointers to the f32 factors the library multiplies
  // each by (the inverses of the scales the casts applied): C = alpha * sa * sb * A B + beta C.
  GemmInput a_type = GemmInput::BF16, b_type = GemmInput::BF16;
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  GemmScale a_scale_mode = GemmScale::Tensor, b_scale_mode = GemmScale::Tensor;
};

// Queued on the backend's stream. The algorithm for each distinct shape is chosen
// once by cuBLASLt's heuristic and cached with its descriptors; one 32 MiB workspace.
void gemm(const GemmArgs& g);

// The products of a linear layer w[out,in] over `rows` rows, as linear_forward and
// linear_backward run them (one place, so that lns_bench_kernels times the step's own calls):
//   forward  y[rows,out] = x[rows,in] @ w^T           (y bf16 or f32, beta 0)
//   dgrad    dx[rows,in] (+)= dy[rows,out] @ w        (beta 1 with accumulate)
//   wgrad    dw[out,in] += dy^T @ x                   (f32, beta 1)
GemmArgs linear_forward_args(void* y, DType y_dtype, const void* x, const void* w, int64_t rows, int64_t in,
                             int64_t out);
GemmArgs linear_dgrad_args(void* dx, DType dx_dtype, const void* dy, const void* w, int64_t rows, int64_t in,
                           int64_t out, bool accumulate);
GemmArgs linear_wgrad_args(float* dw, const void* dy, const void* x, int64_t rows, int64_t in, int64_t out);

// For benchmarks: the candidates cuBLASLt's heuristic gives g's plan (gemm() keeps the
// first that runs), and one call of g with candidate i; false where cuBLASLt refuses it.
int gemm_candidates(const GemmArgs& g);
bool gemm_with_candidate(const GemmArgs& g, int i);

}  // namespace lns::cuda
