// cuBLASLt behind gemm() (cuda/gemm.h), and the linear layers on top of it.
// CPU reference of linear_*: src/cpu/linear.cpp.
//
// cuBLASLt is column-major. A row-major matrix X[r, c] with leading dimension ld is
// the column-major X^T[c, r] with the same ld, so the row-major product
// C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T: the operands
// swap places and keep their transpose flags.
#include <cublasLt.h>

#include <map>
#include <utility>
#include <tuple>

#include "cuda/gemm.h"
#include "lns/core/ops.h"
#include "cuda/runtime.h"
#include "lns/core/errors.h"

namespace lns::cuda {
namespace {

void lt_check(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  LOG(FATAL) << "cuBLASLt " << what << " failed with status " << int(s) << " (" << cublasLtGetStatusString(s) << ")";
}

constexpr size_t kWorkspaceBytes = 32u << 20;  // what NVIDIA recommends for Hopper

// The heuristic's candidates, best first. The first that cuBLASLt runs is kept: the
// heuristic does not check all that the matmul does (on an H200, 2026-11-28, it offered
// algorithms for FP8 products whose misaligned scale pointers every one of them then
// refused), so a plan is proven by its first call, and a refusal by all says what was asked.
constexpr int kCandidates = 8;

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algos[kCandidates]{};
  int found = 0;
  int chosen = -1;  // index into algos once a call ran; -1 before the first call
};

using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int,
                       int64_t, int64_t, int64_t, uint32_t, uint32_t, uint32_t, int, int, int, int>;

cudaDataType_t input_type(GemmInput t) {
  return t == GemmInput::E4M3 ? CUDA_R_8F_E4M3 : t == GemmInput::E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_16BF;
}
int64_t input_size(GemmInput t) { return t == GemmInput::BF16 ? 2 : 1; }

// What cuBLASLt's FP8 matmul takes (its documentation's requirements), checked before
// the library is asked so that a violation is our message, not a status code.
void check_fp8(const GemmArgs& g) {
  const bool fp8_a = g.a_type != GemmInput::BF16, fp8_b = g.b_type != GemmInput::BF16;
  if (!fp8_a && !fp8_b) return;
  LNS_CHECK(fp8_a && fp8_b) << "gemm: FP8 and bf16 operands do not mix";
  LNS_CHECK(!(g.a_type == GemmInput::E5M2 && g.b_type == GemmInput::E5M2)) << "gemm: E5M2 x E5M2 has no FP8 kernel";
  LNS_CHECK(!g.trans_a && g.trans_b) << "gemm: FP8 operands must both be K-major (cuBLASLt's TN)";
  LNS_CHECK(g.batch == 1) << "gemm: FP8 products are not batched here";
  LNS_CHECK(g.a_scale && g.b_scale) << "gemm: FP8 operands need their scale pointers";
  for (const int64_t v : {g.M, g.N, g.K, g.lda, g.ldb})
    LNS_CHECK(v % 16 == 0) << "gemm: FP8 needs M, N, K and leading dimensions in multiples of 16; M=" << g.M
                           << " N=" << g.N << " K=" << g.K << " lda=" << g.lda << " ldb=" << g.ldb;
  const bool block_a = g.a_scale_mode != GemmScale::Tensor, block_b = g.b_scale_mode != GemmScale::Tensor;
  LNS_CHECK(block_a == block_b) << "gemm: block scales on one FP8 operand need them on the other";
  LNS_CHECK(!(g.a_scale_mode == GemmScale::Block128 && g.b_scale_mode == GemmScale::Block128))
      << "gemm: 128x128 tile scales on both operands have no FP8 kernel (one must be 1x128)";
  // Per-tensor scales too: on an H200 a scale 4 bytes past a 16-byte boundary made every
  // algorithm return NOT_SUPPORTED (lns/core/fp8_linear.h lays the scales out for this).
  LNS_CHECK(reinterpret_cast<uintptr_t>(g.a_scale) % 16 == 0 && reinterpret_cast<uintptr_t>(g.b_scale) % 16 == 0)
      << "gemm: FP8 scale pointers must be 16-byte aligned (A at " << g.a_scale << ", B at " << g.b_scale << ")";
}

cublasLtMatmulMatrixScale_t scale_mode(GemmScale s) {
  return s == GemmScale::Vec128     ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
         : s == GemmScale::Block128 ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                    : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

// The alignment cuBLASLt may assume for an operand: the largest power of two up to
// 256 dividing its address (and, batched, every matrix's address). Without it the
// heuristic assumes 256 and may pick a kernel that faults on a weight that starts
// 32 bytes into the flat buffer.
uint32_t alignment(const void* p, int64_t stride_bytes, int batch) {
  uint64_t bits = reinterpret_cast<uintptr_t>(p) | (batch > 1 ? uint64_t(stride_bytes) : 0) | 256;
  return static_cast<uint32_t>(bits & (~bits + 1));  // lowest set bit
}

struct Lt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<Key, Plan> plans;
  Lt() {
    lt_check(cublasLtCreate(&handle), "create");
    LNS_CUDA_CHECK(cudaMalloc(&workspace, kWorkspaceBytes));
  }
};

Lt& lt() {
  static Lt* l = new Lt();  // lives to the end of the process (no teardown order issues)
  return *l;
}

cublasLtMatrixLayout_t layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int batch,
                              int64_t stride) {
  cublasLtMatrixLayout_t l;
  lt_check(cublasLtMatrixLayoutCreate(&l, t, rows, cols, ld), "layout");
  if (batch > 1) {
    int32_t b = batch;
    lt_check(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof(b)), "batch");
    lt_check(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
             "batch stride");
  }
  return l;
}

// FP8 scale pointers; cuBLASLt's A is our B.
void set_scales(cublasLtMatmulDesc_t desc, const GemmArgs& g) {
  const void* sa = g.b_scale;
  const void* sb = g.a_scale;
  lt_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)), "A scale");
  lt_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)), "B scale");
}

Plan& plan_for(const GemmArgs& g) {
  const int64_t csize = g.c_dtype == DType::F32 ? 4 : 2;
  const uint32_t al_a = alignment(g.A, g.stride_a * input_size(g.a_type), g.batch),
                 al_b = alignment(g.B, g.stride_b * input_size(g.b_type), g.batch),
                 al_c = alignment(g.C, g.stride_c * csize, g.batch);
  const Key key{g.trans_a, g.trans_b, g.M,        g.N,        g.K,        g.lda, g.ldb, g.ldc,
                int(g.c_dtype), g.batch, g.stride_a, g.stride_b, g.stride_c, al_a, al_b, al_c,
                int(g.a_type), int(g.b_type), int(g.a_scale_mode), int(g.b_scale_mode)};
  Lt& l = lt();
  auto it = l.plans.find(key);
  if (it != l.plans.end()) return it->second;
  Plan p;
  lt_check(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  const cublasOperation_t ta = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our B
  const cublasOperation_t tb = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  lt_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa");
  lt_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb");
  if (g.a_scale_mode != GemmScale::Tensor) {  // block-scaled FP8; cuBLASLt's A is our B
    const int32_t ma = scale_mode(g.b_scale_mode), mb = scale_mode(g.a_scale_mode);
    lt_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof(ma)), "A scale mode");
    lt_check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof(mb)), "B scale mode");
  }
  p.a = layout(input_type(g.b_type), g.trans_b ? g.K : g.N, g.trans_b ? g.N : g.K, g.ldb, g.batch, g.stride_b);
  p.b = layout(input_type(g.a_type), g.trans_a ? g.M : g.K, g.trans_a ? g.K : g.M, g.lda, g.batch, g.stride_a);
  p.c = layout(g.c_dtype == DType::F32 ? CUDA_R_32F : CUDA_R_16BF, g.N, g.M, g.ldc, g.batch, g.stride_c);
  if (g.a_type != GemmInput::BF16) set_scales(p.desc, g);  // as NVIDIA's FP8 sample: before the heuristic
  cublasLtMatmulPreference_t pref;
  lt_check(cublasLtMatmulPreferenceCreate(&pref), "preference");
  const uint64_t ws = kWorkspaceBytes;
  lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
           "workspace");
  // cuBLASLt's A is our B and its B our A; C and D are the same buffer.
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_b}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_c}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_c}};
  for (const auto& [attr, value] : aligns)
    lt_check(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)), "alignment");
  cublasLtMatmulHeuristicResult_t results[kCandidates]{};
  lt_check(cublasLtMatmulAlgoGetHeuristic(l.handle, p.desc, p.a, p.b, p.c, p.c, pref, kCandidates, results, &p.found),
           "heuristic");
  cublasLtMatmulPreferenceDestroy(pref);
  LNS_CHECK(p.found > 0) << "cuBLASLt has no algorithm for M=" << g.M << " N=" << g.N << " K=" << g.K;
  for (int i = 0; i < p.found; ++i) p.algos[i] = results[i].algo;
  return l.plans.emplace(key, p).first->second;
}

// g with the plan's candidate i.
cublasStatus_t run_candidate(Plan& p, const GemmArgs& g, int i) {
  Lt& l = lt();
  if (g.a_type != GemmInput::BF16) set_scales(p.desc, g);  // per call: the plan is shared by linears of a shape
  return cublasLtMatmul(l.handle, p.desc, &g.alpha, g.B, p.a, g.A, p.b, &g.beta, g.C, p.c, g.C, p.c, &p.algos[i],
                        l.workspace, kWorkspaceBytes, stream());
}

}  // namespace

int gemm_candidates(const GemmArgs& g) {
  check_fp8(g);
  return plan_for(g).found;
}

bool gemm_with_candidate(const GemmArgs& g, int i) {
  check_fp8(g);
  Plan& p = plan_for(g);
  LNS_CHECK(i >= 0 && i < p.found) << "gemm_with_candidate: candidate " << i << " of " << p.found;
  const cublasStatus_t s = run_candidate(p, g, i);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  lt_check(s, "matmul");
  return true;
}

int64_t gemm_scale_floats(GemmScale s, int64_t rows, int64_t K) {
  const int64_t tiles = (K + 127) / 128;
  switch (s) {
    case GemmScale::Tensor: return 1;
    case GemmScale::Vec128: return tiles * ((rows + 3) / 4 * 4);
    case GemmScale::Block128: return (rows + 127) / 128 * ((tiles + 3) / 4 * 4);
  }
  return 0;
}

void gemm(const GemmArgs& g) {
  if (g.M == 0 || g.N == 0) return;
  check_fp8(g);
  Plan& p = plan_for(g);
  const auto run = [&](int i) { return run_candidate(p, g, i); };
  if (p.chosen >= 0) return lt_check(run(p.chosen), "matmul");
  // First call of this plan: the first candidate cuBLASLt runs (a refusal launches nothing).
  cublasStatus_t s = CUBLAS_STATUS_NOT_SUPPORTED;
  for (int i = 0; i < p.found && s == CUBLAS_STATUS_NOT_SUPPORTED; ++i)
    if ((s = run(i)) == CUBLAS_STATUS_SUCCESS) {
      p.chosen = i;
      LOG_IF(INFO, i > 0) << "cuBLASLt refused its first " << i << " algorithm(s) for M=" << g.M << " N=" << g.N
                          << " K=" << g.K << "; the next one runs";
    }
  if (s == CUBLAS_STATUS_NOT_SUPPORTED)
    LOG(FATAL) << "cuBLASLt runs none of the " << p.found << " algorithms its heuristic gave for M=" << g.M
               << " N=" << g.N << " K=" << g.K << " (operand types " << int(g.a_type) << ", " << int(g.b_type)
               << ", output " << (g.c_dtype == DType::F32 ? "f32" : "bf16") << ", beta " << g.beta
               << "): CUBLAS_STATUS_NOT_SUPPORTED";
  lt_check(s, "matmul");
}

GemmArgs linear_forward_args(void* y, DType y_dtype, const void* x, const void* w, int64_t rows, int64_t in,
                             int64_t out) {
  GemmArgs g;
  g.M = rows, g.N = out, g.K = in;
  g.A = x, g.lda = in;
  g.B = w, g.ldb = in, g.trans_b = true;
  g.C = y, g.ldc = out, g.c_dtype = y_dtype;
  return g;
}

GemmArgs linear_dgrad_args(void* dx, DType dx_dtype, const void* dy, const void* w, int64_t rows, int64_t in,
                           int64_t out, bool accumulate) {
  GemmArgs g;
  g.M = rows, g.N = in, g.K = out;
  g.A = dy, g.lda = out;
  g.B = w, g.ldb = in;
  g.C = dx, g.ldc = in, g.c_dtype = dx_dtype;
  g.beta = accumulate ? 1.0f : 0.0f;  // no separate add pass
  return g;
}

GemmArgs linear_wgrad_args(float* dw, const void* dy, const void* x, int64_t rows, int64_t in, int64_t out) {
  GemmArgs g;
  g.M = out, g.N = in, g.K = rows;
  g.A = dy, g.lda = out, g.trans_a = true;
  g.B = x, g.ldb = in;
  g.C = dw, g.ldc = in, g.c_dtype = DType::F32;
  g.beta = 1.0f;  // straight into the f32 gradient
  return g;
}

// y[N,out] = x[N,in] @ w[out,in]^T
void linear_forward(Tensor y, Tensor x, Tensor w) {
  LNS_CHECK(x.dtype == DType::BF16 && w.dtype == DType::BF16) << "CUDA linear takes bf16 x and w";
  const int64_t in = w.dim(1), out = w.dim(0), rows = x.numel() / in;
  LNS_CHECK(x.dim(-1) == in && y.numel() == rows * out);
  gemm(linear_forward_args(y.data, y.dtype, x.data, w.data, rows, in, out));
}

// dx[N,in] = dy @ w (+= with accumulate_dx); dw[out,in] += dy^T @ x.
void linear_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, bool accumulate_dx) {
  const int64_t in = w.dim(1), out = w.dim(0), rows = dy.numel() / out;
  LNS_CHECK(dy.dtype == DType::BF16 && x.dtype == DType::BF16 && w.dtype == DType::BF16 && dw.dtype == DType::F32)
      << "CUDA linear: bf16 dy, x and w, f32 dw";
  LNS_CHECK(x.numel() == rows * in && dw.numel() == out * in && (dx.empty() || dx.numel() == rows * in));
  if (!dx.empty()) gemm(linear_dgrad_args(dx.data, dx.dtype, dy.data, w.data, rows, in, out, accumulate_dx));
  gemm(linear_wgrad_args(static_cast<float*>(dw.data), dy.data, x.data, rows, in, out));
}

// This file's ops on CUDA (lns/core/op_table.h).
LNS_REGISTER_OPS(Device::CUDA) {
  LNS_REGISTER_OP(linear_forward, cuda::linear_forward);
  LNS_REGISTER_OP(linear_backward, cuda::linear_backward);
}

}  // namespace lns::cuda
