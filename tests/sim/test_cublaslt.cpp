// The cuBLASLt stand-in (src/cuda/sim/cublaslt.cpp) against an independent f64 GEMM,
// called the way src/cuda/gemm.cpp calls cuBLASLt, and each of its validations firing
// on a deliberately broken call (death tests). Runs on the test stub of the emulator
// (CPU build) and on the emulator itself (-DLNS_CUDA_SIM=ON).
#include <cublasLt.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "lns/core/bf16.h"
#include "lns/core/fp8_format.h"
#include "tests/sim/device_mem.h"

namespace {

using lns::simtest::device_alloc;
using lns::simtest::device_free;

struct Case {
  bool ta = false, tb = false;
  int64_t m = 5, n = 7, k = 9;
  int64_t pad_a = 0, pad_b = 0, pad_c = 0;  // ld = rows + pad
  int batch = 1;
  int64_t gap = 0;  // extra elements between the matrices of a batch
  bool f32_out = false;
  float alpha = 1.0f, beta = 0.0f;
  bool positive = false;  // A and B in [0, 1) rather than [-1, 1)
};

// One column-major GEMM problem in device memory, with the host copies the reference uses.
struct Problem {
  Case c;
  int64_t a_rows, a_cols, b_rows, b_cols, lda, ldb, ldc, sa, sb, sc;
  std::vector<uint16_t> a, b;
  std::vector<double> c0;  // C before the product
  void *da = nullptr, *db = nullptr, *dc = nullptr;
  size_t a_bytes, b_bytes, c_bytes;

  explicit Problem(const Case& cs, unsigned seed = 1) : c(cs) {
    a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
    b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
    lda = a_rows + c.pad_a, ldb = b_rows + c.pad_b, ldc = c.m + c.pad_c;
    sa = lda * a_cols + c.gap, sb = ldb * b_cols + c.gap, sc = ldc * c.n + c.gap;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(c.positive ? 0.0f : -1.0f, 1.0f);
    a.resize(sa * c.batch), b.resize(sb * c.batch), c0.resize(sc * c.batch);
    for (auto& x : a) x = lns::f32_to_bf16(u(rng));
    for (auto& x : b) x = lns::f32_to_bf16(u(rng));
    for (auto& x : c0) x = c.f32_out ? u(rng) : lns::bf16_to_f32(lns::f32_to_bf16(u(rng)));
    a_bytes = a.size() * 2, b_bytes = b.size() * 2, c_bytes = c0.size() * (c.f32_out ? 4 : 2);
    da = device_alloc(a_bytes), db = device_alloc(b_bytes), dc = device_alloc(c_bytes);
    lns::simtest::upload(da, a.data(), a_bytes);
    lns::simtest::upload(db, b.data(), b_bytes);
    upload_c();
  }
  ~Problem() { device_free(da), device_free(db), device_free(dc); }
  void upload_c() {
    std::vector<char> host(c_bytes);
    for (size_t i = 0; i < c0.size(); ++i) {
      if (c.f32_out) {
        const float f = float(c0[i]);
        std::memcpy(host.data() + 4 * i, &f, 4);
      } else {
        const uint16_t h = lns::f32_to_bf16(float(c0[i]));
        std::memcpy(host.data() + 2 * i, &h, 2);
      }
    }
    lns::simtest::upload(dc, host.data(), c_bytes);
  }
  std::vector<double> result() const {
    std::vector<char> host(c_bytes);
    lns::simtest::download(host.data(), dc, c_bytes);
    std::vector<double> out(c0.size());
    for (size_t i = 0; i < out.size(); ++i) {
      if (c.f32_out) {
        float f;
        std::memcpy(&f, host.data() + 4 * i, 4);
        out[i] = f;
      } else {
        uint16_t h;
        std::memcpy(&h, host.data() + 2 * i, 2);
        out[i] = lns::bf16_to_f32(h);
      }
    }
    return out;
  }
  double A(int e, int64_t r, int64_t col) const { return lns::bf16_to_f32(a[e * sa + col * lda + r]); }
  double B(int e, int64_t r, int64_t col) const { return lns::bf16_to_f32(b[e * sb + col * ldb + r]); }
};

// Everything one cublasLtMatmul needs, built as gemm.cpp builds it.
struct Call {
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t res{};
  size_t ws_bytes = 1u << 20;
  void* ws = nullptr;

  cublasLtMatrixLayout_t layout(cudaDataType t, int64_t rows, int64_t cols, int64_t ld, int batch, int64_t stride) {
    cublasLtMatrixLayout_t l;
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&l, t, rows, cols, ld), CUBLAS_STATUS_SUCCESS);
    if (batch > 1) {
      int32_t b = batch;
      cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b);
      cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
    }
    return l;
  }
  // Descriptors and preference; the heuristic runs in plan().
  explicit Call(const Problem& p) {
    const Case& c = p.c;
    cublasLtCreate(&h);
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t ta = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    la = layout(CUDA_R_16BF, p.a_rows, p.a_cols, p.lda, c.batch, p.sa);
    lb = layout(CUDA_R_16BF, p.b_rows, p.b_cols, p.ldb, c.batch, p.sb);
    lc = layout(c.f32_out ? CUDA_R_32F : CUDA_R_16BF, c.m, c.n, p.ldc, c.batch, p.sc);
    cublasLtMatmulPreferenceCreate(&pref);
    const uint64_t max_ws = ws_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof max_ws);
    ws = device_alloc(ws_bytes);
    // the alignments each operand really has, as gemm.cpp computes them
    const void* ptr[3] = {p.da, p.db, p.dc};
    const int64_t stride_bytes[3] = {p.sa * 2, p.sb * 2, p.sc * (c.f32_out ? 4 : 2)};
    for (int i = 0; i < 4; ++i) {
      const int j = i < 3 ? i : 2;
      uint64_t bits = reinterpret_cast<uintptr_t>(ptr[j]) | (c.batch > 1 ? uint64_t(stride_bytes[j]) : 0) | 256;
      align(i, uint32_t(bits & (~bits + 1)));
    }
  }
  void align(int operand, uint32_t bytes) {
    cublasLtMatmulPreferenceSetAttribute(
        pref, cublasLtMatmulPreferenceAttributes_t(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + operand), &bytes,
        sizeof bytes);
  }
  void plan() {
    int found = 0;
    ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 1, &res, &found), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(found, 1);
    ASSERT_LE(res.workspaceSize, ws_bytes);
  }
  cublasStatus_t run(const Problem& p, const void* A, const void* B, void* C, size_t ws_size) {
    return cublasLtMatmul(h, desc, &p.c.alpha, A, la, B, lb, &p.c.beta, C, lc, C, lc, &res.algo, ws, ws_size,
                          nullptr);
  }
  cublasStatus_t run(const Problem& p) { return run(p, p.da, p.db, p.dc, ws_bytes); }
  ~Call() {
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulPreferenceDestroy(pref), cublasLtMatmulDescDestroy(desc), cublasLtDestroy(h);
    device_free(ws);
  }
};

// D = alpha op(A) op(B) + beta C in f64, checked against the stand-in's result with the
// worst-case bound of an f32 sum of k terms (products of bf16 values are exact in f32)
// plus one rounding to the output type. Elements of C
// outside the matrices (ld padding, batch gaps) must be untouched.
void check(const Problem& p) {
  const Case& c = p.c;
  const std::vector<double> got = p.result();
  std::vector<bool> inside(got.size(), false);
  for (int e = 0; e < c.batch; ++e)
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double sum = 0, mag = 0;
        for (int64_t q = 0; q < c.k; ++q) {
          const double x = c.ta ? p.A(e, q, i) : p.A(e, i, q), y = c.tb ? p.B(e, j, q) : p.B(e, q, j);
          sum += x * y, mag += std::fabs(x * y);
        }
        const size_t at = e * p.sc + j * p.ldc + i;
        const double want = c.alpha * sum + c.beta * p.c0[at];
        const double tol = std::ldexp(double(c.k + 3), -23) * (std::fabs(c.alpha) * mag + std::fabs(c.beta * p.c0[at])) +
                           (c.f32_out ? 0.0 : std::ldexp(std::fabs(want), -8)) + 1e-30;
        EXPECT_NEAR(got[at], want, tol) << "batch " << e << " D(" << i << "," << j << ")";
        inside[at] = true;
      }
  for (size_t i = 0; i < got.size(); ++i)
    if (!inside[i]) {
      ASSERT_EQ(got[i], p.c0[i]) << "element " << i << " outside D was written";
    }
}

void run_case(const Case& c) {
  Problem p(c);
  Call call(p);
  call.plan();
  ASSERT_EQ(call.run(p), CUBLAS_STATUS_SUCCESS);
  lns::simtest::synchronize();
  check(p);
}

TEST(SimCublasLt, TransposesLeadingDimensionsAndOutputTypes) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool f32 : {false, true}) {
        Case c;
        c.ta = ta, c.tb = tb, c.f32_out = f32;
        c.m = 13, c.n = 6, c.k = 21, c.pad_a = 3, c.pad_b = 1, c.pad_c = 2;
        SCOPED_TRACE(testing::Message() << "ta=" << ta << " tb=" << tb << " f32=" << f32);
        run_case(c);
      }
}

TEST(SimCublasLt, AlphaBetaAccumulateInPlace) {
  for (bool f32 : {false, true}) {
    Case c;
    c.f32_out = f32, c.alpha = -0.75f, c.beta = 1.0f, c.tb = true;
    run_case(c);
    c.beta = 0.5f, c.ta = true;
    run_case(c);
  }
}

TEST(SimCublasLt, StridedBatchWithGaps) {
  Case c;
  c.batch = 4, c.gap = 5, c.m = 8, c.n = 3, c.k = 16, c.tb = true, c.f32_out = true, c.alpha = 0.125f;
  run_case(c);
  c.f32_out = false, c.ta = true, c.tb = false, c.beta = 1.0f;
  run_case(c);
}

TEST(SimCublasLt, LongReductionAccumulatesInF32) {
  // k = 4096 positive products: a bf16 (or f16) accumulator would stall far below the
  // sum, outside the f32 bound check() allows.
  Case c;
  c.m = 2, c.n = 2, c.k = 4096, c.f32_out = true, c.positive = true;
  run_case(c);
}

// gemm.cpp promises the alignment each pointer really has (a weight can start 32
// bytes into the flat parameter buffer): a 32-byte aligned A with that promise is fine.
TEST(SimCublasLt, AlignmentPreferenceMatchingThePointersIsAccepted) {
  Case c;
  c.ta = true, c.m = 4, c.n = 5, c.k = 16;
  Problem p(c);
  Call call(p);
  call.align(0, 32);
  call.plan();
  void* big = device_alloc(p.a_bytes + 32);
  lns::simtest::upload(static_cast<char*>(big) + 32, p.a.data(), p.a_bytes);
  ASSERT_EQ(call.run(p, static_cast<char*>(big) + 32, p.db, p.dc, call.ws_bytes), CUBLAS_STATUS_SUCCESS);
  lns::simtest::synchronize();
  check(p);
  device_free(big);
}

TEST(SimCublasLt, RunsOnTheStreamAndReadsAlphaAtTheCall) {
  Case c;
  c.f32_out = true, c.alpha = 2.0f;
  Problem p(c);
  Call call(p);
  call.plan();
  Case changed = c;
  ASSERT_EQ(cublasLtMatmul(call.h, call.desc, &changed.alpha, p.da, call.la, p.db, call.lb, &changed.beta, p.dc,
                           call.lc, p.dc, call.lc, &call.res.algo, call.ws, call.ws_bytes, nullptr),
            CUBLAS_STATUS_SUCCESS);
  changed.alpha = 1000.0f;  // host pointer mode: the value at the call counts
  if (lns::simtest::deferred_until_sync()) {
    EXPECT_EQ(p.result(), p.c0) << "the product ran before the stream did";
  }
  lns::simtest::synchronize();
  check(p);
}

// ---- each validation fires (death tests) -----------------------------------------

// Re-executed rather than forked: the emulator may have worker threads.
struct SimCublasLtDeathTest : testing::Test {
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(SimCublasLtDeathTest, LeadingDimensionBelowRows) {
  cublasLtMatrixLayout_t l;
  EXPECT_DEATH(cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, 16, 4, 15), "leading dimension 15 < rows 16");
}

TEST_F(SimCublasLtDeathTest, InnerDimensionsDiffer) {
  Case c;
  Problem p(c);
  Call call(p);
  cublasLtMatrixLayoutDestroy(call.lb);
  call.lb = call.layout(CUDA_R_16BF, c.k + 1, c.n, c.k + 1, 1, 0);
  EXPECT_DEATH(call.plan(), "inner dimensions differ");
}

TEST_F(SimCublasLtDeathTest, F32InputIsNotModelled) {
  Case c;
  Problem p(c);
  Call call(p);
  cublasLtMatrixLayoutDestroy(call.la);
  call.la = call.layout(CUDA_R_32F, c.m, c.k, c.m, 1, 0);
  EXPECT_DEATH(call.plan(), "A must be CUDA_R_16BF");
}

TEST_F(SimCublasLtDeathTest, HostPointer) {
  Case c;
  Problem p(c);
  Call call(p);
  call.plan();
  EXPECT_DEATH(call.run(p, p.a.data(), p.db, p.dc, call.ws_bytes), "cublasLtMatmul A: .* live device allocation");
}

TEST_F(SimCublasLtDeathTest, BatchExtentPastTheAllocation) {
  Case c;
  c.batch = 3;
  Problem p(c);
  Call call(p);
  cublasLtMatrixLayoutDestroy(call.lb);
  call.lb = call.layout(CUDA_R_16BF, p.b_rows, p.b_cols, p.ldb, 3, p.sb + 1);  // one element too far per matrix
  call.plan();
  EXPECT_DEATH(call.run(p), "cublasLtMatmul B: .* live device allocation");
}

TEST_F(SimCublasLtDeathTest, PointerLessAlignedThanPromised) {
  Case c;
  Problem p(c);
  Call call(p);
  call.align(0, 16);
  call.plan();  // promised: A 16-byte aligned, D 256 (the default)
  void* big = device_alloc(p.a_bytes + 64);
  EXPECT_EQ(call.run(p, static_cast<char*>(big) + 16, p.db, p.dc, call.ws_bytes), CUBLAS_STATUS_SUCCESS);
  EXPECT_DEATH(call.run(p, static_cast<char*>(big) + 8, p.db, p.dc, call.ws_bytes),
               "A at .* is only 8-byte aligned, the preference promised 16");
  void* c2 = device_alloc(p.c_bytes + 64);
  EXPECT_DEATH(call.run(p, p.da, p.db, static_cast<char*>(c2) + 32, call.ws_bytes),
               "D at .* is only 32-byte aligned, the preference promised 256");
  lns::simtest::synchronize();
  device_free(big), device_free(c2);
}

TEST_F(SimCublasLtDeathTest, BatchStrideBreaksAlignment) {
  Case c;
  c.batch = 2, c.gap = 2, c.tb = true;  // A's matrices 47 elements (94 bytes) apart
  Problem p(c);
  Call call(p);
  call.align(0, 256);  // a promise that looks only at the first matrix's address
  call.plan();
  EXPECT_DEATH(call.run(p), "A at .*batch stride .* is only 2-byte aligned");
}

TEST_F(SimCublasLtDeathTest, WorkspaceSmallerThanTheAlgoNeeds) {
  Case c;
  Problem p(c);
  Call call(p);
  call.plan();
  ASSERT_GT(call.res.workspaceSize, 0u);
  EXPECT_DEATH(call.run(p, p.da, p.db, p.dc, call.res.workspaceSize - 1), "workspace of .* bytes, the algo needs");
  // ... or promised bigger than its allocation
  EXPECT_DEATH(call.run(p, p.da, p.db, p.dc, call.ws_bytes + 256), "workspace: .* live device allocation");
}

TEST_F(SimCublasLtDeathTest, AlgoOfAnotherProblem) {
  Case c;
  Problem p(c);
  Call call(p);
  call.plan();
  const int32_t two = 2;  // descriptors changed after the heuristic chose for them
  cublasLtMatrixLayoutSetAttribute(call.la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &two, sizeof two);
  cublasLtMatrixLayoutSetAttribute(call.lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &two, sizeof two);
  cublasLtMatrixLayoutSetAttribute(call.lc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &two, sizeof two);
  EXPECT_DEATH(call.run(p), "algo was chosen for other descriptors");
  cublasLtMatmulAlgo_t junk{};
  EXPECT_DEATH(cublasLtMatmul(call.h, call.desc, &c.alpha, p.da, call.la, p.db, call.lb, &c.beta, p.dc, call.lc,
                              p.dc, call.lc, &junk, call.ws, call.ws_bytes, nullptr),
               "not returned by cublasLtMatmulAlgoGetHeuristic");
}

TEST_F(SimCublasLtDeathTest, OutputOverlapsInput) {
  Case c;
  c.m = 8, c.n = 8, c.k = 8;  // A and D the same size, so D can sit on A
  Problem p(c);
  Call call(p);
  call.plan();
  EXPECT_DEATH(call.run(p, p.da, p.db, p.da, call.ws_bytes), "D overlaps A");
}

TEST_F(SimCublasLtDeathTest, BatchMatricesOfDOverlap) {
  Case c;
  c.batch = 2;
  Problem p(c);
  Call call(p);
  cublasLtMatrixLayoutDestroy(call.lc);
  call.lc = call.layout(CUDA_R_16BF, c.m, c.n, p.ldc, 2, p.ldc);  // stride of one column
  call.plan();
  EXPECT_DEATH(call.run(p), "the matrices of D's batch overlap");
}

TEST_F(SimCublasLtDeathTest, AttributeOfTheWrongSize) {
  cublasLtMatrixLayout_t l;
  cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, 4, 4, 4);
  const int64_t b = 2;
  EXPECT_DEATH(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b),
               "CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT takes 4 bytes, got 8");
  cublasLtMatrixLayoutDestroy(l);
}

// ---- FP8 ------------------------------------------------------------------------------

// An FP8 product as src/cuda/fp8_linear.cpp asks for it: A [k,m] transposed and B [k,n]
// (column-major, both K-major), E4M3 or E5M2 codes, f32 scale pointers in device memory,
// bf16 D. The reference decodes the codes exactly (lns/core/fp8_format.h) and sums in f64.
struct Fp8Call {
  int64_t m = 16, n = 32, k = 48;
  cudaDataType ta = CUDA_R_8F_E4M3, tb = CUDA_R_8F_E5M2;
  cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
  float scale[2] = {0.25f, 1.0f / 1024};
  // block scaling (cublasLtMatmulMatrixScale_t per operand; 0: per tensor, scale[]); the
  // factors then live in `blocks` (64 floats of 1 unless set): A's from 0, B's from b_at
  int32_t mode[2] = {0, 0};
  std::vector<float> blocks = std::vector<float>(64, 1.0f);
  int b_at = 32;
  int scalar_b_at = 4;  // per tensor: B's scale this many floats after A's (16 bytes: cuBLASLt's alignment)
  std::vector<uint8_t> a, b;
  void *da = nullptr, *db = nullptr, *dd = nullptr, *ds = nullptr, *ws = nullptr;
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t res{};

  lns::Fp8Format fmt(cudaDataType t) const { return t == CUDA_R_8F_E4M3 ? lns::Fp8Format::E4M3 : lns::Fp8Format::E5M2; }
  void build() {
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> code(0, 255);
    const auto finite = [&](cudaDataType t) {
      for (;;) {
        const uint8_t c = uint8_t(code(rng));
        if (std::isfinite(lns::fp8_to_f32(c, fmt(t)))) return c;
      }
    };
    a.resize(k * m), b.resize(k * n);
    for (auto& x : a) x = finite(ta);
    for (auto& x : b) x = finite(tb);
    const bool blocked = mode[0] || mode[1];
    da = device_alloc(a.size()), db = device_alloc(b.size()), dd = device_alloc(m * n * 2);
    ds = device_alloc(blocked ? blocks.size() * 4 : (scalar_b_at + 1) * 4);
    lns::simtest::upload(da, a.data(), a.size()), lns::simtest::upload(db, b.data(), b.size());
    if (blocked) {
      lns::simtest::upload(ds, blocks.data(), blocks.size() * 4);
    } else {
      lns::simtest::upload(ds, &scale[0], 4);
      lns::simtest::upload(static_cast<float*>(ds) + scalar_b_at, &scale[1], 4);
    }
    cublasLtCreate(&h);
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    const float* sa = static_cast<float*>(ds);
    const float* sb = sa + (blocked ? b_at : scalar_b_at);
    for (int i = 0; i < 2; ++i)
      if (mode[i])
        cublasLtMatmulDescSetAttribute(desc, i == 0 ? CUBLASLT_MATMUL_DESC_A_SCALE_MODE : CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                       &mode[i], sizeof mode[i]);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
    cublasLtMatrixLayoutCreate(&la, ta, opa == CUBLAS_OP_T ? k : m, opa == CUBLAS_OP_T ? m : k, opa == CUBLAS_OP_T ? k : m);
    cublasLtMatrixLayoutCreate(&lb, tb, opb == CUBLAS_OP_N ? k : n, opb == CUBLAS_OP_N ? n : k, opb == CUBLAS_OP_N ? k : n);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, m, n, m);
    cublasLtMatmulPreferenceCreate(&pref);
    ws = device_alloc(1 << 20);
    const uint64_t max_ws = 1 << 20;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof max_ws);
  }
  void plan() {
    int found = 0;
    cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, ld, ld, pref, 1, &res, &found);
  }
  void run() {
    const float alpha = 2.0f, beta = 0.0f;
    cublasLtMatmul(h, desc, &alpha, da, la, db, lb, &beta, dd, ld, dd, ld, &res.algo, ws, 1 << 20, nullptr);
    lns::simtest::synchronize();
  }
};

TEST(SimCublasLtFp8, IsTheProductOfTheDecodedCodesTimesAlphaAndTheScales) {
  Fp8Call f;
  f.build(), f.plan(), f.run();
  std::vector<uint16_t> d(f.m * f.n);
  lns::simtest::download(d.data(), f.dd, d.size() * 2);
  for (int64_t i = 0; i < f.m; ++i)
    for (int64_t j = 0; j < f.n; ++j) {
      double sum = 0, mag = 0;
      for (int64_t q = 0; q < f.k; ++q) {
        const double x = lns::fp8_to_f32(f.a[i * f.k + q], lns::Fp8Format::E4M3),  // A^T: column i of A, K-major
            y = lns::fp8_to_f32(f.b[j * f.k + q], lns::Fp8Format::E5M2);
        sum += x * y, mag += std::fabs(x * y);
      }
      const double want = 2.0 * f.scale[0] * f.scale[1] * sum;
      const double tol = std::ldexp(double(f.k + 3), -23) * 2.0 * f.scale[0] * f.scale[1] * mag + std::ldexp(std::fabs(want), -8);
      EXPECT_NEAR(lns::bf16_to_f32(d[j * f.m + i]), want, tol) << i << "," << j;
    }
}

TEST_F(SimCublasLtDeathTest, Fp8RefusesWhatTheLibraryRefuses) {
  {
    Fp8Call f;
    f.opa = CUBLAS_OP_N;  // "NN"
    f.build();
    EXPECT_DEATH(f.plan(), "FP8 needs A transposed and B not");
  }
  {
    Fp8Call f;
    f.ta = CUDA_R_8F_E5M2;
    f.build();
    EXPECT_DEATH(f.plan(), "A and B both CUDA_R_8F_E5M2 is not supported");
  }
  {
    Fp8Call f;
    f.k = 40;  // not a multiple of 16
    f.build();
    EXPECT_DEATH(f.plan(), "FP8 needs every dimension a multiple of 16");
  }
  {
    Fp8Call f;
    f.scalar_b_at = 1;  // a per-tensor scale 4 bytes past a 16-byte boundary
    f.build();
    f.plan();  // the real heuristic takes it too; its matmul refuses it
    EXPECT_DEATH(f.run(), "the B scale at .* is not 16-byte aligned");
  }
  {
    Fp8Call f;
    f.build();
    const int8_t fast = 1;
    EXPECT_DEATH(cublasLtMatmulDescSetAttribute(f.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast),
                 "FAST_ACCUM = 1 .* is not modelled");
  }
}

// Block scales (--fp8=blockwise): what cuBLASLt refuses, and a factor of a real tile that
// is not a positive finite number. (Their product: GemmFp8.BlockScalesMultiplyEachTilesProduct,
// through the wrapper.)
TEST_F(SimCublasLtDeathTest, Fp8BlockScalesRefuseWhatTheLibraryRefuses) {
  const int32_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, blk = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  {
    Fp8Call f;
    f.mode[0] = f.mode[1] = blk;
    f.build();
    EXPECT_DEATH(f.plan(), "128x128 block scales on both A and B are not supported");
  }
  {
    Fp8Call f;
    f.mode[0] = vec;  // B per tensor
    f.build();
    EXPECT_DEATH(f.plan(), "a per-tensor scale beside a block scale");
  }
  {
    Fp8Call f;
    f.mode[0] = vec, f.mode[1] = blk, f.b_at = 33;
    f.build();
    f.plan();
    EXPECT_DEATH(f.run(), "the B block scale tensor at .* is not 16-byte aligned");
  }
  {
    Fp8Call f;
    f.mode[0] = vec, f.mode[1] = blk;
    f.blocks[5] = 0.0f;  // A's factor for row 5 of the one K tile
    f.build();
    f.plan();
    EXPECT_DEATH(f.run(), "the A block scale 5 is 0.000000, not a positive finite number");
  }
  {
    Fp8Call f;  // a padding entry (B's [1][4] tensor: entries 1-3) is never read
    f.mode[0] = vec, f.mode[1] = blk;
    f.blocks[32 + 2] = NAN;
    f.build();
    f.plan();
    f.run();
  }
}

// A scale that is not a positive finite number (a scaling bug upstream) is reported when
// the product runs, where the real library would silently use it.
TEST_F(SimCublasLtDeathTest, Fp8ScaleThatIsNotPositiveIsReported) {
  Fp8Call f;
  f.scale[1] = 0.0f;
  f.build();
  f.plan();
  EXPECT_DEATH(f.run(), "the B scale at .* is 0.000000, not a positive finite number");
}

}  // namespace
