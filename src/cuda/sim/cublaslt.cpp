// The cuBLASLt stand-in of the emulation build (include/cublasLt.h): descriptors are
// plain structs, the heuristic returns one "algorithm" that records the problem it was
// chosen for, and cublasLtMatmul validates everything the real library requires or
// silently assumes before queueing a CPU product on the stream:
//   D[m,n] = alpha * op(A)[m,k] op(B)[k,n] + beta * C[m,n]   (column-major, per batch)
// with bf16 A/B, f32 accumulation in k order, one rounding to the bf16 or f32 output.
// FP8 A/B (E4M3, E5M2) as the library documents them: only "TN" (A transposed, B not),
// never E5M2 with E5M2, dimensions and leading dimensions in multiples of 16, no batch;
// each code decoded exactly (lns/core/fp8_format.h) and the product multiplied by alpha and the
// A and B scales, read from device memory when the product runs. A scale that is not a
// positive finite number is reported: the library would use it and return garbage.
// Block scales (VEC128_32F, BLK128x128_32F; run_matmul_blocked says their layout) are
// modelled with what the library refuses for them: a block scale beside a per-tensor
// one, 128x128 tiles on both operands. Any scale pointer, per-tensor too, must be 16-byte
// aligned.
// Anything outside what src/cuda/gemm.cpp uses (other types, epilogues, device-side
// alpha) is reported as "not modelled" rather than guessed.
#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/sim/sim_api.h"
#include "lns/core/bf16.h"
#include "lns/core/fp8_format.h"

struct cublasLtContext {
  bool live = true;
};
struct cublasLtMatmulDescOpaque_st {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  const float* scale_ptr[2] = {nullptr, nullptr};  // A, B scale pointers (device); null: 1
  int32_t scale_mode[2] = {0, 0};  // A, B: cublasLtMatmulMatrixScale_t (scalar, 1x128 or 128x128 tiles)
};
struct cublasLtMatrixLayoutOpaque_st {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch = 1;
  int64_t stride = 0;  // elements between consecutive matrices of a strided batch
};
struct cublasLtMatmulPreferenceOpaque_st {
  uint64_t max_workspace = 0;
  // cuBLASLt assumes 256-byte aligned operands unless told less (CUDA's malloc alignment)
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
};

namespace {

using lns::sim::fail;

// The workspace the emulated algorithm claims (capped by the preference); it is
// overwritten each time the product runs, as a split-K kernel would.
constexpr uint64_t kAlgoWorkspace = 4u << 20;
constexpr uint64_t kAlgoMagic = 0x4c4e5353494d4c54ull;  // "LNSSIMLT"

std::string str(const void* p) {
  char b[32];
  std::snprintf(b, sizeof b, "%p", p);
  return b;
}

template <class T>
T attr_value(const void* buf, size_t size, const char* call, const char* attr) {
  if (!buf) fail(std::string(call) + ": null buffer for " + attr);
  if (size != sizeof(T))
    fail(std::string(call) + ": " + attr + " takes " + std::to_string(sizeof(T)) + " bytes, got " +
         std::to_string(size));
  T v;
  std::memcpy(&v, buf, sizeof(T));
  return v;
}

bool is_fp8(cudaDataType t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }
size_t elem_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : is_fp8(t) ? 1 : 2; }

// Elements from a matrix's first to one past its last element over the whole batch.
uint64_t extent(const cublasLtMatrixLayoutOpaque_st& l) {
  if (l.rows == 0 || l.cols == 0) return 0;
  return uint64_t(l.batch - 1) * uint64_t(l.stride) + (l.cols - 1) * uint64_t(l.ld) + l.rows;
}

// The alignment an operand really has: every matrix of its batch starts on it.
uint32_t actual_alignment(const void* p, const cublasLtMatrixLayoutOpaque_st& l) {
  uint64_t bits = reinterpret_cast<uintptr_t>(p) | 256;
  if (l.batch > 1) bits |= uint64_t(l.stride) * elem_size(l.type);
  return uint32_t(bits & (~bits + 1));
}

// Folds every field that defines the problem into one number: an algo is valid only
// for the descriptors it was chosen with.
uint64_t signature(const cublasLtMatmulDescOpaque_st& d, const cublasLtMatrixLayoutOpaque_st* const l[4]) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(d.compute), mix(d.scale), mix(d.trans_a), mix(d.trans_b), mix(d.scale_mode[0]), mix(d.scale_mode[1]);
  for (int i = 0; i < 4; ++i)
    mix(l[i]->type), mix(l[i]->rows), mix(l[i]->cols), mix(uint64_t(l[i]->ld)), mix(uint64_t(l[i]->batch)),
        mix(uint64_t(l[i]->stride));
  return h;
}

const char* const kOperand[4] = {"A", "B", "C", "D"};

// What the real heuristic would refuse or what the stand-in does not compute.
void check_problem(const char* call, const cublasLtMatmulDescOpaque_st& d,
                   const cublasLtMatrixLayoutOpaque_st* const l[4]) {
  const std::string c = call;
  if (d.compute != CUBLAS_COMPUTE_32F || d.scale != CUDA_R_32F)
    fail(c + ": only CUBLAS_COMPUTE_32F with CUDA_R_32F scale is modelled by the emulation");
  const bool fp8 = is_fp8(l[0]->type) || is_fp8(l[1]->type);
  for (int i = 0; i < 2; ++i)
    if (fp8 ? !is_fp8(l[i]->type) : l[i]->type != CUDA_R_16BF)
      fail(c + ": " + kOperand[i] + (fp8 ? " must be FP8 like the other input (CUDA_R_8F_E4M3 or CUDA_R_8F_E5M2)"
                                         : " must be CUDA_R_16BF (an input type modelled by the emulation, with FP8)"));
  if (fp8) {  // the FP8 matmul's documented requirements
    if (l[0]->type == CUDA_R_8F_E5M2 && l[1]->type == CUDA_R_8F_E5M2)
      fail(c + ": FP8 with A and B both CUDA_R_8F_E5M2 is not supported by cuBLASLt");
    if (d.trans_a != CUBLAS_OP_T || d.trans_b != CUBLAS_OP_N)
      fail(c + ": FP8 needs A transposed and B not (the \"TN\" format)");
    if (l[0]->batch > 1) fail(c + ": batched FP8 products are not modelled by the emulation");
    const int32_t ma = d.scale_mode[0], mb = d.scale_mode[1];
    if ((ma == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F) != (mb == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F))
      fail(c + ": a per-tensor scale beside a block scale is not modelled by the emulation (A scale mode " +
           std::to_string(ma) + ", B " + std::to_string(mb) + ")");
    if (ma == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F && mb == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F)
      fail(c + ": 128x128 block scales on both A and B are not supported by cuBLASLt (one must be VEC128_32F)");
    for (int i = 0; i < 4; ++i)
      if (l[i]->rows % 16 || l[i]->cols % 16 || (uint64_t(l[i]->ld) * elem_size(l[i]->type)) % 16)
        fail(c + ": FP8 needs every dimension a multiple of 16 and 16-byte leading dimensions; " + kOperand[i] +
             " is " + std::to_string(l[i]->rows) + "x" + std::to_string(l[i]->cols) + " with ld " +
             std::to_string(l[i]->ld));
  }
  if (l[2]->type != CUDA_R_16BF && l[2]->type != CUDA_R_32F)
    fail(c + ": C must be CUDA_R_16BF or CUDA_R_32F");
  if (l[3]->type != l[2]->type) fail(c + ": D and C must have the same type");
  const bool ta = d.trans_a == CUBLAS_OP_T, tb = d.trans_b == CUBLAS_OP_T;
  const uint64_t m = ta ? l[0]->cols : l[0]->rows, k = ta ? l[0]->rows : l[0]->cols;
  const uint64_t kb = tb ? l[1]->cols : l[1]->rows, n = tb ? l[1]->rows : l[1]->cols;
  auto dims = [](const cublasLtMatrixLayoutOpaque_st* x) {
    return std::to_string(x->rows) + "x" + std::to_string(x->cols);
  };
  if (k != kb)
    fail(c + ": op(A) is " + std::to_string(m) + "x" + std::to_string(k) + " but op(B) is " + std::to_string(kb) +
         "x" + std::to_string(n) + " (inner dimensions differ)");
  for (int i = 2; i < 4; ++i)
    if (l[i]->rows != m || l[i]->cols != n)
      fail(c + ": " + kOperand[i] + " is " + dims(l[i]) + ", op(A) op(B) is " + std::to_string(m) + "x" +
           std::to_string(n));
  for (int i = 1; i < 4; ++i)
    if (l[i]->batch != l[0]->batch)
      fail(c + ": batch count of " + kOperand[i] + " (" + std::to_string(l[i]->batch) + ") differs from A's (" +
           std::to_string(l[0]->batch) + ")");
}

void need(const void* p, const char* call, const char* what) {
  if (!p) fail(std::string(call) + ": null " + what);
}

struct Operand {
  cublasLtMatrixLayoutOpaque_st l;
  const void* p;
};

float load(const Operand& o, uint64_t b, uint64_t r, uint64_t c) {
  const uint64_t i = b * uint64_t(o.l.stride) + c * uint64_t(o.l.ld) + r;
  if (o.l.type == CUDA_R_32F) return static_cast<const float*>(o.p)[i];
  if (is_fp8(o.l.type))
    return lns::fp8_to_f32(static_cast<const uint8_t*>(o.p)[i],
                           o.l.type == CUDA_R_8F_E4M3 ? lns::Fp8Format::E4M3 : lns::Fp8Format::E5M2);
  return lns::bf16_to_f32(static_cast<const uint16_t*>(o.p)[i]);
}

// Runs on the stream: the product of one queued cublasLtMatmul.
void run_matmul(bool ta, bool tb, const Operand& A, const Operand& B, const Operand& C, const Operand& D,
                float alpha, float beta, void* workspace, uint64_t workspace_used) {
  if (workspace_used) std::memset(workspace, 0xff, workspace_used);  // as scratch of a real kernel
  const uint64_t m = D.l.rows, n = D.l.cols, k = ta ? A.l.rows : A.l.cols;
  // op(A) [m,k] and op(B) [k,n] as f32, row-major; acc[n] is row i of the product. Each
  // element is summed in k order (the j loop vectorises across elements, not within
  // one sum); bf16 and FP8 products are exact in f32, so FMA contraction changes nothing.
  std::vector<float> a(m * k), bk(k * n), acc(n);
  for (int32_t b = 0; b < D.l.batch; ++b) {
    for (uint64_t i = 0; i < m; ++i)
      for (uint64_t p = 0; p < k; ++p) a[i * k + p] = ta ? load(A, b, p, i) : load(A, b, i, p);
    for (uint64_t p = 0; p < k; ++p)
      for (uint64_t j = 0; j < n; ++j) bk[p * n + j] = tb ? load(B, b, j, p) : load(B, b, p, j);
    for (uint64_t i = 0; i < m; ++i) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (uint64_t p = 0; p < k; ++p) {
        const float x = a[i * k + p];
        const float* row = &bk[p * n];
        for (uint64_t j = 0; j < n; ++j) acc[j] += x * row[j];
      }
      for (uint64_t j = 0; j < n; ++j) {
        float v = alpha * acc[j];
        if (beta != 0.0f) v += beta * load(C, b, i, j);  // beta == 0: C is not read
        const uint64_t at = b * uint64_t(D.l.stride) + j * uint64_t(D.l.ld) + i;
        if (D.l.type == CUDA_R_32F)
          static_cast<float*>(const_cast<void*>(D.p))[at] = v;
        else
          static_cast<uint16_t*>(const_cast<void*>(D.p))[at] = lns::f32_to_bf16(v);
      }
    }
  }
}

// Block-scaled FP8 (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, BLK128x128_32F: DeepSeek-V3's
// recipe as Transformer Engine lays it out for the library). An operand stored K-major
// (K rows, `outer` columns: A transposed or B not) has one f32 factor per tile of 128
// along K: per column with VEC128, in a [ceil(K/128)][outer rounded up to 4] tensor
// (columns contiguous), or per 128 x 128 tile with BLK128x128, in a
// [ceil(outer/128)][ceil(K/128) rounded up to 4] tensor. The product sums each K tile
// in f32 and adds it times both tiles' factors.
struct BlockScale {
  int32_t mode = 0;
  uint64_t k = 0, outer = 0;
  const float* p = nullptr;
  uint64_t tiles() const { return (k + 127) / 128; }
  uint64_t floats() const {
    return mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F ? tiles() * ((outer + 3) / 4 * 4)
                                                           : (outer + 127) / 128 * ((tiles() + 3) / 4 * 4);
  }
  float at(uint64_t col, uint64_t tile) const {
    return mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F ? p[tile * ((outer + 3) / 4 * 4) + col]
                                                           : p[col / 128 * ((tiles() + 3) / 4 * 4) + tile];
  }
};

void run_matmul_blocked(const Operand& A, const Operand& B, const Operand& C, const Operand& D, float alpha,
                        float beta, const BlockScale& sa, const BlockScale& sb, const std::string& call) {
  const uint64_t m = D.l.rows, n = D.l.cols, k = A.l.rows, tiles = sa.tiles();
  for (const BlockScale* s : {&sa, &sb})
    for (uint64_t i = 0; i < s->floats(); ++i)
      if (!(s->p[i] > 0.0f) || !std::isfinite(s->p[i])) {
        // padding entries are never read; only the factors of real tiles must be usable
        const bool vec = s->mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        const uint64_t ld = vec ? (s->outer + 3) / 4 * 4 : (s->tiles() + 3) / 4 * 4;
        if (vec ? i % ld >= s->outer : i % ld >= s->tiles()) continue;
        fail(call + ": the " + (s == &sa ? "A" : "B") + " block scale " + std::to_string(i) + " is " +
             std::to_string(s->p[i]) + ", not a positive finite number (an FP8 scaling bug; the library would use it)");
      }
  std::vector<float> a(m * k), bk(k * n), acc(n), part(n);
  for (uint64_t i = 0; i < m; ++i)
    for (uint64_t p = 0; p < k; ++p) a[i * k + p] = load(A, 0, p, i);  // A stored K x m: op(A) = A^T
  for (uint64_t p = 0; p < k; ++p)
    for (uint64_t j = 0; j < n; ++j) bk[p * n + j] = load(B, 0, p, j);
  for (uint64_t i = 0; i < m; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (uint64_t t = 0; t < tiles; ++t) {
      std::fill(part.begin(), part.end(), 0.0f);
      for (uint64_t p = t * 128; p < std::min(k, (t + 1) * 128); ++p) {
        const float x = a[i * k + p];
        const float* row = &bk[p * n];
        for (uint64_t j = 0; j < n; ++j) part[j] += x * row[j];
      }
      const float fa = sa.at(i, t);
      for (uint64_t j = 0; j < n; ++j) acc[j] += part[j] * fa * sb.at(j, t);
    }
    for (uint64_t j = 0; j < n; ++j) {
      float v = alpha * acc[j];
      if (beta != 0.0f) v += beta * load(C, 0, i, j);
      const uint64_t at = j * uint64_t(D.l.ld) + i;
      if (D.l.type == CUDA_R_32F)
        static_cast<float*>(const_cast<void*>(D.p))[at] = v;
      else
        static_cast<uint16_t*>(const_cast<void*>(D.p))[at] = lns::f32_to_bf16(v);
    }
  }
}

bool overlap(const void* p, uint64_t pb, const void* q, uint64_t qb) {
  const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(q);
  return pb && qb && a < b + qb && b < a + pb;
}

}  // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  need(handle, "cublasLtCreate", "handle");
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_(other)";
  }
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType) {
  need(desc, "cublasLtMatmulDescCreate", "descriptor");
  *desc = new cublasLtMatmulDescOpaque_st{computeType, scaleType};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  const char* call = "cublasLtMatmulDescSetAttribute";
  need(desc, call, "descriptor");
  if (attr == CUBLASLT_MATMUL_DESC_TRANSA || attr == CUBLASLT_MATMUL_DESC_TRANSB) {
    const char* name = attr == CUBLASLT_MATMUL_DESC_TRANSA ? "CUBLASLT_MATMUL_DESC_TRANSA" : "CUBLASLT_MATMUL_DESC_TRANSB";
    const auto op = attr_value<int32_t>(buf, size, call, name);
    if (op != CUBLAS_OP_N && op != CUBLAS_OP_T) fail(std::string(call) + ": " + name + " must be N or T");
    (attr == CUBLASLT_MATMUL_DESC_TRANSA ? desc->trans_a : desc->trans_b) = cublasOperation_t(op);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attr == CUBLASLT_MATMUL_DESC_A_SCALE_POINTER || attr == CUBLASLT_MATMUL_DESC_B_SCALE_POINTER) {
    const int i = attr == CUBLASLT_MATMUL_DESC_A_SCALE_POINTER ? 0 : 1;
    desc->scale_ptr[i] = attr_value<const float*>(buf, size, call, i == 0 ? "CUBLASLT_MATMUL_DESC_A_SCALE_POINTER"
                                                                        : "CUBLASLT_MATMUL_DESC_B_SCALE_POINTER");
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attr == CUBLASLT_MATMUL_DESC_A_SCALE_MODE || attr == CUBLASLT_MATMUL_DESC_B_SCALE_MODE) {
    const int i = attr == CUBLASLT_MATMUL_DESC_A_SCALE_MODE ? 0 : 1;
    const char* name = i == 0 ? "CUBLASLT_MATMUL_DESC_A_SCALE_MODE" : "CUBLASLT_MATMUL_DESC_B_SCALE_MODE";
    const auto mode = attr_value<int32_t>(buf, size, call, name);
    if (mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F && mode != CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F &&
        mode != CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F)
      fail(std::string(call) + ": " + name + " = " + std::to_string(mode) +
           " is not modelled by the emulation (SCALAR_32F, VEC128_32F, BLK128x128_32F)");
    desc->scale_mode[i] = mode;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attr == CUBLASLT_MATMUL_DESC_FAST_ACCUM) {
    if (attr_value<int8_t>(buf, size, call, "CUBLASLT_MATMUL_DESC_FAST_ACCUM") != 0)
      fail(std::string(call) + ": CUBLASLT_MATMUL_DESC_FAST_ACCUM = 1 (Hopper's reduced-precision FP8 accumulation) "
                               "is not modelled by the emulation");
    return CUBLAS_STATUS_SUCCESS;
  }
  fail(std::string(call) + ": attribute " + std::to_string(int(attr)) + " is not modelled by the emulation");
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  const std::string call = "cublasLtMatrixLayoutCreate";
  need(layout, call.c_str(), "layout");
  if (type != CUDA_R_16BF && type != CUDA_R_32F && !is_fp8(type))
    fail(call + ": type " + std::to_string(int(type)) +
         " is not modelled by the emulation (CUDA_R_16BF, CUDA_R_32F, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2)");
  // Column-major: consecutive columns may not overlap.
  if (ld < 1 || uint64_t(ld) < rows)
    fail(call + ": leading dimension " + std::to_string(ld) + " < rows " + std::to_string(rows) +
         " (column-major: ld must be >= max(1, rows))");
  *layout = new cublasLtMatrixLayoutOpaque_st{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
  const std::string call = "cublasLtMatrixLayoutSetAttribute";
  need(layout, call.c_str(), "layout");
  if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT) {
    const auto b = attr_value<int32_t>(buf, size, call.c_str(), "CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT");
    if (b < 1) fail(call + ": batch count " + std::to_string(b) + " < 1");
    layout->batch = b;
  } else if (attr == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET) {
    const auto s = attr_value<int64_t>(buf, size, call.c_str(), "CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET");
    if (s < 0) fail(call + ": negative batch stride " + std::to_string(s) + " is not modelled by the emulation");
    layout->stride = s;
  } else {
    fail(call + ": attribute " + std::to_string(int(attr)) + " is not modelled by the emulation");
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  need(pref, "cublasLtMatmulPreferenceCreate", "preference");
  *pref = new cublasLtMatmulPreferenceOpaque_st;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  const std::string call = "cublasLtMatmulPreferenceSetAttribute";
  need(pref, call.c_str(), "preference");
  if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
    pref->max_workspace = attr_value<uint64_t>(buf, size, call.c_str(), "CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES");
  } else if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
    const int i = attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES;
    const std::string name = std::string("CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_") + kOperand[i] + "_BYTES";
    const auto a = attr_value<uint32_t>(buf, size, call.c_str(), name.c_str());
    if (a == 0 || (a & (a - 1))) fail(call + ": " + name + " = " + std::to_string(a) + " is not a power of two");
    pref->align[i] = a;
  } else {
    fail(call + ": attribute " + std::to_string(int(attr)) + " is not modelled by the emulation");
  }
  return CUBLAS_STATUS_SUCCESS;
}

// algo.data: [0] magic, [1] problem signature, [2] promised alignments of A, B, C, D
// (16 bits each), [3] workspace bytes the algorithm needs.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
  const char* call = "cublasLtMatmulAlgoGetHeuristic";
  need(handle, call, "handle"), need(desc, call, "matmul descriptor"), need(pref, call, "preference");
  need(Adesc, call, "A layout"), need(Bdesc, call, "B layout"), need(Cdesc, call, "C layout");
  need(Ddesc, call, "D layout"), need(results, call, "result array"), need(returned, call, "result count");
  if (requested < 1) fail(std::string(call) + ": requestedAlgoCount " + std::to_string(requested) + " < 1");
  const cublasLtMatrixLayoutOpaque_st* const l[4] = {Adesc, Bdesc, Cdesc, Ddesc};
  check_problem(call, *desc, l);
  cublasLtMatmulHeuristicResult_t r{};
  r.algo.data[0] = kAlgoMagic;
  r.algo.data[1] = signature(*desc, l);
  for (int i = 0; i < 4; ++i) r.algo.data[2] |= uint64_t(pref->align[i]) << (16 * i);
  r.workspaceSize = std::min(pref->max_workspace, kAlgoWorkspace);
  r.algo.data[3] = r.workspaceSize;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  results[0] = r;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  const std::string call = "cublasLtMatmul";
  need(handle, call.c_str(), "handle"), need(desc, call.c_str(), "matmul descriptor");
  need(Adesc, call.c_str(), "A layout"), need(Bdesc, call.c_str(), "B layout");
  need(Cdesc, call.c_str(), "C layout"), need(Ddesc, call.c_str(), "D layout");
  need(alpha, call.c_str(), "alpha"), need(beta, call.c_str(), "beta");
  need(algo, call.c_str(), "algo (the stand-in has no default algorithm: use the heuristic's)");
  const cublasLtMatrixLayoutOpaque_st* const l[4] = {Adesc, Bdesc, Cdesc, Ddesc};
  check_problem(call.c_str(), *desc, l);
  if (algo->data[0] != kAlgoMagic) fail(call + ": algo was not returned by cublasLtMatmulAlgoGetHeuristic");
  if (algo->data[1] != signature(*desc, l))
    fail(call + ": algo was chosen for other descriptors (shape, layout, type, transpose or batch differ)");
  float a, b;  // host pointer mode: read now, the caller's variables may be gone when it runs
  std::memcpy(&a, alpha, 4), std::memcpy(&b, beta, 4);

  const uint64_t need_ws = algo->data[3];
  if (workspace_bytes < need_ws)
    fail(call + ": workspace of " + std::to_string(workspace_bytes) + " bytes, the algo needs " +
         std::to_string(need_ws));
  if (workspace_bytes) lns::sim::require_device_range(workspace, workspace_bytes, "cublasLtMatmul workspace");

  const void* const ptr[4] = {A, B, C, D};
  uint64_t bytes[4];
  for (int i = 0; i < 4; ++i) {
    bytes[i] = extent(*l[i]) * elem_size(l[i]->type);
    if (i == 2 && b == 0.0f) continue;  // beta == 0: C is never read
    const std::string what = call + " " + kOperand[i];
    if (bytes[i]) lns::sim::require_device_range(ptr[i], bytes[i], what.c_str());
    const uint32_t promised = uint32_t(algo->data[2] >> (16 * i)) & 0xffff, has = actual_alignment(ptr[i], *l[i]);
    if (has < promised)
      fail(call + ": " + kOperand[i] + " at " + str(ptr[i]) +
           (l[i]->batch > 1 ? " (batch stride " + std::to_string(l[i]->stride * elem_size(l[i]->type)) + " bytes)" : "") +
           " is only " + std::to_string(has) + "-byte aligned, the preference promised " + std::to_string(promised) +
           " (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_" + kOperand[i] + "_BYTES)");
  }
  // Outputs: a kernel writes D while other blocks still read A, B (and C unless in place).
  for (int i = 0; i < 2; ++i)
    if (overlap(D, bytes[3], ptr[i], bytes[i]))
      fail(call + ": D overlaps " + kOperand[i] + " (the product would read what it has overwritten)");
  if (b != 0.0f) {
    if (C == D && (Cdesc->ld != Ddesc->ld || Cdesc->stride != Ddesc->stride))
      fail(call + ": in place (C == D) needs the same layout for C and D");
    if (C != D && overlap(D, bytes[3], C, bytes[2])) fail(call + ": D partly overlaps C");
  }
  if (Ddesc->batch > 1 && Ddesc->rows && Ddesc->cols &&
      uint64_t(Ddesc->stride) < (Ddesc->cols - 1) * uint64_t(Ddesc->ld) + Ddesc->rows)
    fail(call + ": the matrices of D's batch overlap (stride " + std::to_string(Ddesc->stride) + " < " +
         std::to_string((Ddesc->cols - 1) * uint64_t(Ddesc->ld) + Ddesc->rows) + " elements of one matrix)");

  const bool ta = desc->trans_a == CUBLAS_OP_T, tb = desc->trans_b == CUBLAS_OP_T;
  const Operand oa{*Adesc, A}, ob{*Bdesc, B}, oc{*Cdesc, C}, od{*Ddesc, D};
  const uint64_t read_c = b != 0.0f ? bytes[2] : 0;
  // The scale pointers as set now (the descriptor may be changed before the product runs).
  const float* const scale[2] = {desc->scale_ptr[0], desc->scale_ptr[1]};
  const bool blocked = desc->scale_mode[0] != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;  // both are (check_problem)
  BlockScale bs[2];
  for (int i = 0; i < 2; ++i) {
    bs[i] = BlockScale{desc->scale_mode[i], l[i]->rows, l[i]->cols, scale[i]};  // K-major: K rows (TN)
    if (blocked && !scale[i]) fail(call + ": block scaling needs the " + kOperand[i] + " scale pointer");
    if (scale[i]) {
      const std::string what = call + " " + kOperand[i] + " scale";
      lns::sim::require_device_range(scale[i], blocked ? bs[i].floats() * sizeof(float) : sizeof(float), what.c_str());
      if (!is_fp8(l[i]->type)) fail(call + ": a scale pointer for " + kOperand[i] + ", which is not FP8, is not modelled");
      // per-tensor scales too (measured on an H200, 2026-11-28: NOT_SUPPORTED from every algorithm)
      if (reinterpret_cast<uintptr_t>(scale[i]) % 16)
        fail(call + ": the " + kOperand[i] + (blocked ? " block scale tensor" : " scale") + " at " + str(scale[i]) +
             " is not 16-byte aligned");
    }
  }
  if (blocked) {
    lns::sim::enqueue(
        stream, "cublasLtMatmul",
        [=] {
          lns::sim::declare_access(A, bytes[0], false), lns::sim::declare_access(B, bytes[1], false);
          lns::sim::declare_access(C, read_c, false), lns::sim::declare_access(workspace, need_ws, true);
          for (int i = 0; i < 2; ++i) lns::sim::declare_access(scale[i], bs[i].floats() * sizeof(float), false);
          lns::sim::declare_access(D, bytes[3], true);
          if (need_ws) std::memset(workspace, 0xff, need_ws);
          run_matmul_blocked(oa, ob, oc, od, a, b, bs[0], bs[1], call);
        },
        __builtin_return_address(0));
    return CUBLAS_STATUS_SUCCESS;
  }
  lns::sim::enqueue(
      stream, "cublasLtMatmul",
      [=] {
        lns::sim::declare_access(A, bytes[0], false), lns::sim::declare_access(B, bytes[1], false);
        lns::sim::declare_access(C, read_c, false), lns::sim::declare_access(workspace, need_ws, true);
        lns::sim::declare_access(D, bytes[3], true);
        float factor = a;  // alpha * scale_A * scale_B, in that order
        for (int i = 0; i < 2; ++i) {
          if (!scale[i]) continue;
          lns::sim::declare_access(scale[i], sizeof(float), false);
          const float s = *scale[i];
          if (!(s > 0.0f) || !std::isfinite(s))
            fail(call + ": the " + kOperand[i] + " scale at " + str(scale[i]) + " is " + std::to_string(s) +
                 ", not a positive finite number (an FP8 scaling bug; the library would use it)");
          factor *= s;
        }
        run_matmul(ta, tb, oa, ob, oc, od, factor, b, workspace, need_ws);
      },
      __builtin_return_address(0));
  return CUBLAS_STATUS_SUCCESS;
}
