// Shape and device checks shared by the CPU kernels (programmer errors: CHECK).
#pragma once
#include "lns/core/errors.h"
#include "lns/core/tensor.h"

namespace lns::cpu {

inline void require_cpu(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (!t->empty()) LNS_CHECK(t->device == Device::CPU) << "CPU kernel given a CUDA tensor";
}

// Rows and columns of a tensor read as a matrix [numel / last, last].
inline int64_t rows_of(const Tensor& t) { return t.numel() / t.dim(-1); }
inline int64_t cols_of(const Tensor& t) { return t.dim(-1); }

}  // namespace lns::cpu

#include <cblas.h>
#include <omp.h>

namespace lns::cpu {

// The CPU backend parallelises with OpenMP at the op level (rows, heads) and calls
// OpenBLAS single-threaded inside: two thread pools spinning on the same cores cost
// 2-4x (measured, docs/BENCHMARKS.md).
inline void blas_single_threaded() {
  static const bool once = (openblas_set_num_threads(1), true);
  (void)once;
}

// C[M,N] = alpha * op(A)[M,K] op(B)[K,N] + beta * C, row-major, with the M rows split
// into one contiguous block per OpenMP thread. Each output element is computed by one
// thread with the same K order, so the bits do not depend on the split.
inline void gemm_rows(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,
                      float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                      float beta, float* C, int64_t ldc) {
  blas_single_threaded();
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t m0 = M * t / nt, m1 = M * (t + 1) / nt;
    if (m1 > m0) {
      const float* a = ta == CblasNoTrans ? A + m0 * lda : A + m0;
      cblas_sgemm(CblasRowMajor, ta, tb, m1 - m0, N, K, alpha, a, lda, B, ldb, beta, C + m0 * ldc,
                  ldc);
    }
  }
}

}  // namespace lns::cpu
