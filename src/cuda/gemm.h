// The cuBLASLt GEMM wrapper: every matrix product of the CUDA backend goes through
// gemm(). Row-major operands as the model sees them (weights [out, in] like
// torch.nn.Linear), bf16 inputs, f32 accumulation, output bf16 or f32 (with beta = 1
// accumulating in place, e.g. weight gradients). Strided batches for attention.
#pragma once
#include <cstdint>

#include "lns/tensor.h"

namespace lns::cuda {

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
};

// Queued on the backend's stream. The algorithm for each distinct shape is chosen
// once by cuBLASLt's heuristic and cached with its descriptors; one 32 MiB workspace.
void gemm(const GemmArgs& g);

}  // namespace lns::cuda
