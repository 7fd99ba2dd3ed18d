// The per-tensor FP8 cast (src/cuda/fp8_cast.h): bf16 -> E4M3/E5M2 with a scale read from
// the FP8 table, optionally transposed in the same pass (cuBLASLt's FP8 GEMMs take both
// operands K-major, so the backward needs w, x and dy transposed), and the cast's
// health merged into the table without atomics. CPU reference: lns::cast_to_fp8. Also
// the health record every FP8 cast uses (partials_for, record_partials: fp8_common.cuh).
#include <algorithm>

#include "cuda/fp8_cast.h"
#include "cuda/fp8_common.cuh"
#include "cuda/op_profile.h"

namespace lns::cuda {
namespace {

constexpr int kTile = 32;                   // a 32 x 32 tile per block
constexpr int kRowsPerPass = 8;             // 256 threads: 32 columns x 8 rows at a time
constexpr int kThreads = kTile * kRowsPerPass;

// One tile of x[R,C]: codes to q[r,c] and (through shared memory, so both the read of x
// and the write of qT are coalesced) qT[c,r]; the tile's health to partial[tile][4].
__global__ void fp8_cast_kernel(const bf16* x, int64_t R, int64_t C, const float* row, bool e4m3, uint8_t* q,
                                uint8_t* qT, float* partial) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  __shared__ float red[32];
  const float scale = row[kFp8Scale];
  const float limit = e4m3 ? 448.0f : 57344.0f;
  const Fp8Format f = e4m3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  Fp8Health h;
  for (int k = ty; k < kTile; k += kRowsPerPass) {
    const int64_t r = r0 + k, c = c0 + tx;
    if (r >= R || c >= C) continue;
    const uint8_t code = h.cast(to_f(x[r * C + c]), scale, limit, f);
    if (q) q[r * C + c] = code;
    tile[k][tx] = code;
  }
  if (qT) {
    __syncthreads();
    for (int k = ty; k < kTile; k += kRowsPerPass) {
      const int64_t c = c0 + k, r = r0 + tx;
      if (r < R && c < C) qT[c * R + r] = tile[tx][k];
    }
  }
  const float amax = block_max(h.amax, red), sat = block_sum(h.sat, red), flushed = block_sum(h.flushed, red),
              nonfinite = block_sum(h.nonfinite, red);
  if (threadIdx.x == 0) {
    float* p = partial + (int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * kStats;
    p[0] = amax, p[1] = sat, p[2] = flushed, p[3] = nonfinite;
  }
}

// The scalar kernels' record (record_partials): one block merges a cast's partials into
// its row (merge_health).
constexpr int kRecordThreads = 256;
__global__ void fp8_record_kernel(float* row, const float* partial, int64_t tiles, float elements) {
  __shared__ float red[32];
  merge_health(row, partial, tiles, elements, red);
}

// fp8_cast's vector path: x[R,C] with C % 8 == 0 (x 16-byte aligned, q 8-byte aligned;
// with qT also R % 16 == 0 and qT 16-byte aligned). 64 x 64 tiles, 256 threads: for the
// load, thread t takes 8 columns (t % 8) of rows t / 8 and t / 8 + 32; for the transpose,
// column t % 64 and its 16 rows from 16 * (t / 64), one 16-byte store into qT. A block
// takes tiles blockIdx.x, + gridDim.x, ...; its health goes to partial[blockIdx.x][4].
constexpr int kVecTile = 64;
__global__ void fp8_cast_vec_kernel(const bf16* __restrict__ x, int64_t R, int64_t C, const float* row, bool e4m3,
                                    uint8_t* q, uint8_t* qT, float* partial, float* rec_row, float rec_elements,
                                    unsigned int* counter) {
  __shared__ Fp8x8 tile[kVecTile][kVecTile / 8];  // one tile's codes: [row][column / 8]
  __shared__ float red[32];
  const float scale = row[kFp8Scale];
  const float limit = e4m3 ? 448.0f : 57344.0f;
  const Fp8Format f = e4m3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
  const int lr = threadIdx.x / 8, lc = threadIdx.x % 8 * 8;         // load: rows lr, lr + 32
  const int tj = threadIdx.x % kVecTile, tr = threadIdx.x / kVecTile * 16;  // transpose: column tj
  const int64_t tiles_c = ceil_div(C, kVecTile), tiles = tiles_c * ceil_div(R, kVecTile);
  Fp8Health h;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = t / tiles_c * kVecTile, c0 = t % tiles_c * kVecTile;
    if (qT) __syncthreads();  // the previous tile's transpose has read `tile`
    for (int half = 0; half < 2; ++half) {
      const int rr = lr + 32 * half;
      const int64_t r = r0 + rr, c = c0 + lc;
      if (r >= R || c >= C) continue;  // C % 8 == 0: the 8 columns are all in or all out
      float v[kVec];
      load<kVec>(x + r * C + c, v);
      Fp8x8 codes;
#pragma unroll
      for (int k = 0; k < kVec; ++k) codes.v[k] = h.cast(v[k], scale, limit, f);
      if (q) *reinterpret_cast<Fp8x8*>(q + r * C + c) = codes;
      if (qT) tile[rr][lc / 8] = codes;
    }
    if (!qT) continue;
    __syncthreads();
    const int64_t c = c0 + tj, r = r0 + tr;  // R % 16 == 0: the 16 rows are all in or all out
    if (c < C && r < R) store_column16(tile, tr, tj, qT + c * R + r);
  }
  h.write_block(partial, red);
  record_if_last(Fp8Record{rec_row, rec_elements, counter}, partial, red);
}

}  // namespace

Fp8Partials partials_for(int64_t n, float* row, int64_t elements) {
  // The buffer whose counter was zeroed, and the most asked of it: asking more may
  // reallocate it, perhaps at the same address (one compute stream a process).
  static void* zeroed = nullptr;
  static size_t asked = 0;
  const size_t bytes = 16 + sizeof(float) * kStats * size_t(n);
  auto* base = static_cast<char*>(scratch(Scratch::Fp8Partials, bytes));
  if (base != zeroed || bytes > asked) {
    LNS_CUDA_CHECK(cudaMemsetAsync(base, 0, 16, stream()));
    zeroed = base, asked = std::max(asked, bytes);
  }
  return {reinterpret_cast<float*>(base + 16),
          Fp8Record{row, static_cast<float>(elements), reinterpret_cast<unsigned int*>(base)}};
}

void record_partials(const Fp8Partials& p, int64_t n) {
  if (!p.rec.row) return;
  LNS_LAUNCH(fp8_record_kernel, 1, kRecordThreads, 0, stream())(p.rec.row, p.partial, n, p.rec.elements);
  LNS_CUDA_LAUNCHED();
}

void fp8_cast(const Tensor& x, float* row, Fp8Format f, bool record, uint8_t* q, uint8_t* qT) {
  const ProfileSegment segment("fp8_cast");  // its own row of the op profile
  expect(x, DType::BF16, "fp8_cast x");
  const int64_t C = x.dim(-1), R = C == 0 ? 0 : x.numel() / C;
  if (R == 0 || C == 0) return;
  if (vec_ok(x.data, C) && (!q || aligned_to(q, 8)) && (!qT || (R % 16 == 0 && aligned_to(qT, 16)))) {
    const int64_t blocks = std::min<int64_t>(ceil_div(C, kVecTile) * ceil_div(R, kVecTile), kCastBlocks);
    const Fp8Partials p = partials_for(blocks, record ? row : nullptr, R * C);
    LNS_LAUNCH(fp8_cast_vec_kernel, unsigned(blocks), 256, 0, stream())(
        ptr<bf16>(x), R, C, row, f == Fp8Format::E4M3, q, qT, p.partial, p.rec.row, p.rec.elements,
        p.rec.counter);  // recorded by its last block
    LNS_CUDA_LAUNCHED();
    return;
  }
  const int64_t gx = ceil_div(C, kTile), gy = ceil_div(R, kTile);
  LNS_CHECK(gy <= 65535) << "fp8_cast: " << R << " rows is more than the grid's 65535 x 32";
  const Fp8Partials p = partials_for(gx * gy, record ? row : nullptr, R * C);
  LNS_LAUNCH(fp8_cast_kernel, dim3(unsigned(gx), unsigned(gy)), kThreads, 0, stream())(
      ptr<bf16>(x), R, C, row, f == Fp8Format::E4M3, q, qT, p.partial);
  LNS_CUDA_LAUNCHED();
  record_partials(p, gx * gy);
}

}  // namespace lns::cuda
