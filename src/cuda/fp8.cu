// The FP8 cast (src/cuda/fp8_cast.h): bf16 -> E4M3/E5M2 with a scale read from the FP8
// table, optionally transposed in the same pass (cuBLASLt's FP8 GEMMs take both
// operands K-major, so the backward needs w, x and dy transposed), and the cast's
// health merged into the table without atomics. CPU reference: lns::cast_to_fp8.
#include "cuda/common.cuh"
#include "cuda/fp8_cast.h"
#include "cuda/op_profile.h"
#include "lns/fp8_linear.h"

namespace lns::cuda {
namespace {

constexpr int kTile = 32;                   // a 32 x 32 tile per block
constexpr int kRowsPerPass = 8;             // 256 threads: 32 columns x 8 rows at a time
constexpr int kThreads = kTile * kRowsPerPass;
constexpr int kStats = 4;                   // amax, saturated, flushed, non-finite

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
  float amax = 0.0f, sat = 0.0f, flushed = 0.0f, nonfinite = 0.0f;
  for (int k = ty; k < kTile; k += kRowsPerPass) {
    const int64_t r = r0 + k, c = c0 + tx;
    if (r >= R || c >= C) continue;
    const float v = to_f(x[r * C + c]);
    if (isfinite(v)) amax = fmaxf(amax, fabsf(v)); else nonfinite += 1.0f;
    const float s = v * scale;
    const uint8_t code = fp8_encode_satfinite(s, f);
    if (isfinite(s) && fabsf(s) > limit) sat += 1.0f;
    if (s != 0.0f && isfinite(s) && (code & 0x7F) == 0) flushed += 1.0f;
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
  amax = block_max(amax, red);
  sat = block_sum(sat, red);
  flushed = block_sum(flushed, red);
  nonfinite = block_sum(nonfinite, red);
  if (threadIdx.x == 0) {
    float* p = partial + (int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * kStats;
    p[0] = amax, p[1] = sat, p[2] = flushed, p[3] = nonfinite;
  }
}

// row += the tiles' health. One block: thread t takes tiles t, t + 256, ... in order, then
// the block reduces in its fixed order, so the sums do not depend on timing (a 1B
// model's activations are ~16k tiles: a single thread would take milliseconds).
constexpr int kRecordThreads = 256;
__global__ void fp8_record_kernel(float* row, const float* partial, int64_t tiles, float elements) {
  __shared__ float red[32];
  float amax = 0.0f, sat = 0.0f, flushed = 0.0f, nonfinite = 0.0f;
  for (int64_t t = threadIdx.x; t < tiles; t += kRecordThreads) {
    amax = fmaxf(amax, partial[t * kStats]);
    sat += partial[t * kStats + 1], flushed += partial[t * kStats + 2], nonfinite += partial[t * kStats + 3];
  }
  amax = block_max(amax, red);
  sat = block_sum(sat, red);
  flushed = block_sum(flushed, red);
  nonfinite = block_sum(nonfinite, red);
  if (threadIdx.x == 0) {
    row[kFp8Amax] = fmaxf(row[kFp8Amax], amax);
    row[kFp8Saturated] += sat, row[kFp8Flushed] += flushed, row[kFp8Nonfinite] += nonfinite;
    row[kFp8Elements] += elements;
  }
}

// ---- --fp8=blockwise: tiles of 128 along K, each with its own power-of-two scale -------
// (include/lns/fp8_linear.h; CPU reference quantize_tiles in src/cpu/linear_fp8.cpp).
// The factor written for a tile is 1/s (exact), in the layouts cuda/gemm.h states for
// GemmScale::Vec128 and Block128; their padding is left unwritten (never read).
constexpr int kTileK = 128;

__device__ __forceinline__ int64_t round4(int64_t n) { return (n + 3) / 4 * 4; }

// 1 x 128 tiles along the rows of x[R,C]: one warp per tile (8 per block), 4 values a lane.
// q[R,C] the codes; s[ceil(C/128)][round4(R)] the factors; partial[r * tilesC + t][4].
__global__ void fp8_tiles_rows_kernel(const bf16* x, int64_t R, int64_t C, bool e4m3, uint8_t* q, float* s,
                                      float* partial) {
  const Fp8Format f = e4m3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
  const int lane = threadIdx.x % 32;
  const int64_t r = int64_t(blockIdx.y) * 8 + threadIdx.x / 32, t = blockIdx.x, tiles = gridDim.x;
  if (r >= R) return;  // a whole warp: no shuffle is split
  float v[4], amax = 0.0f, nonfinite = 0.0f, flushed = 0.0f;
  for (int j = 0; j < 4; ++j) {
    const int64_t c = t * kTileK + lane + 32 * j;
    v[j] = c < C ? to_f(x[r * C + c]) : 0.0f;
    if (isfinite(v[j])) amax = fmaxf(amax, fabsf(v[j])); else nonfinite += 1.0f;
  }
  amax = warp_max(amax);
  const float scale = fp8_pow2_scale(amax, f);
  for (int j = 0; j < 4; ++j) {
    const int64_t c = t * kTileK + lane + 32 * j;
    if (c >= C) continue;
    const float sv = v[j] * scale;
    const uint8_t code = fp8_encode_satfinite(sv, f);
    if (sv != 0.0f && isfinite(sv) && (code & 0x7F) == 0) flushed += 1.0f;
    q[r * C + c] = code;
  }
  flushed = warp_sum(flushed), nonfinite = warp_sum(nonfinite);
  if (lane == 0) {
    s[t * round4(R) + r] = 1.0f / scale;
    float* p = partial + (r * tiles + t) * kStats;
    p[0] = amax, p[1] = 0.0f, p[2] = flushed, p[3] = nonfinite;  // a tile's scale fits its amax: none saturate
  }
}

// 128 x 1 tiles down the columns of x[R,C], written transposed: qT[C,R] (K = R major) and
// s[ceil(R/128)][round4(C)]. A block takes 128 rows x 32 columns: each thread 16 rows of
// one column, the column's amax through shared memory, the codes out through a shared
// tile so that the transposed writes are coalesced. Not recorded (the backward's second
// casts of x and dy).
__global__ void fp8_tiles_cols_kernel(const bf16* x, int64_t R, int64_t C, bool e4m3, uint8_t* qT, float* s) {
  __shared__ float colmax[8][32];
  __shared__ uint8_t tile[kTileK][32 + 4];
  const Fp8Format f = e4m3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const int64_t c0 = int64_t(blockIdx.x) * 32, r0 = int64_t(blockIdx.y) * kTileK, c = c0 + tx;
  float v[16], amax = 0.0f;
  for (int j = 0; j < 16; ++j) {
    const int64_t r = r0 + ty + 8 * j;
    v[j] = r < R && c < C ? to_f(x[r * C + c]) : 0.0f;
    if (isfinite(v[j])) amax = fmaxf(amax, fabsf(v[j]));
  }
  colmax[ty][tx] = amax;
  __syncthreads();
  for (int k = 0; k < 8; ++k) amax = fmaxf(amax, colmax[k][tx]);
  const float scale = fp8_pow2_scale(amax, f);
  for (int j = 0; j < 16; ++j) tile[ty + 8 * j][tx] = fp8_encode_satfinite(v[j] * scale, f);
  if (ty == 0 && c < C) s[int64_t(blockIdx.y) * round4(C) + c] = 1.0f / scale;
  __syncthreads();
  for (int k = threadIdx.x; k < kTileK * 32; k += blockDim.x) {  // consecutive threads, consecutive rows
    const int64_t rr = r0 + k % kTileK, cc = c0 + k / kTileK;
    if (rr < R && cc < C) qT[cc * R + rr] = tile[k % kTileK][k / kTileK];
  }
}

// 128 x 128 tiles of w[R,C]: one block per tile. q[R,C] and qT[C,R] the codes; s
// [ceil(R/128)][round4(ceil(C/128))] and sT [ceil(C/128)][round4(ceil(R/128))] the factors
// of w and of its transpose (a square tile reads the same both ways); either pair may be
// null (the forward reads w, dx's product its transpose); partial[tile][4].
__global__ void fp8_tiles_blocks_kernel(const bf16* x, int64_t R, int64_t C, bool e4m3, uint8_t* q, uint8_t* qT,
                                        float* s, float* sT, float* partial) {
  __shared__ float red[32];
  const Fp8Format f = e4m3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
  const int64_t tc = blockIdx.x, tr = blockIdx.y, r0 = tr * kTileK, c0 = tc * kTileK;
  float amax = 0.0f, nonfinite = 0.0f, flushed = 0.0f;
  for (int k = threadIdx.x; k < kTileK * kTileK; k += blockDim.x) {
    const int64_t r = r0 + k / kTileK, c = c0 + k % kTileK;
    if (r >= R || c >= C) continue;
    const float v = to_f(x[r * C + c]);
    if (isfinite(v)) amax = fmaxf(amax, fabsf(v)); else nonfinite += 1.0f;
  }
  amax = block_max(amax, red);
  const float scale = fp8_pow2_scale(amax, f);
  for (int k = threadIdx.x; k < kTileK * kTileK; k += blockDim.x) {
    const int64_t r = r0 + k / kTileK, c = c0 + k % kTileK;
    if (r >= R || c >= C) continue;
    const float sv = to_f(x[r * C + c]) * scale;
    const uint8_t code = fp8_encode_satfinite(sv, f);
    if (sv != 0.0f && isfinite(sv) && (code & 0x7F) == 0) flushed += 1.0f;
    if (q) q[r * C + c] = code;
    if (qT) qT[c * R + r] = code;
  }
  flushed = block_sum(flushed, red), nonfinite = block_sum(nonfinite, red);
  if (threadIdx.x == 0) {
    if (s) s[tr * round4(gridDim.x) + tc] = 1.0f / scale;
    if (sT) sT[tc * round4(gridDim.y) + tr] = 1.0f / scale;
    float* p = partial + (tr * gridDim.x + tc) * kStats;
    p[0] = amax, p[1] = 0.0f, p[2] = flushed, p[3] = nonfinite;
  }
}

}  // namespace

void fp8_cast_tiles_rows(const Tensor& x, float* row, Fp8Format f, bool record, uint8_t* q, float* s) {
  const ProfileSegment segment("fp8_cast");  // its own row of the op profile
  expect(x, DType::BF16, "fp8_cast_tiles_rows x");
  const int64_t C = x.dim(-1), R = C == 0 ? 0 : x.numel() / C;
  if (R == 0 || C == 0) return;
  const int64_t tiles = ceil_div(C, kTileK), gy = ceil_div(R, 8);
  LNS_CHECK(gy <= 65535) << "fp8_cast_tiles_rows: " << R << " rows is more than the grid's 65535 x 8";
  auto* partial = static_cast<float*>(scratch(Scratch::Fp8Partials, sizeof(float) * kStats * R * tiles));
  LNS_LAUNCH(fp8_tiles_rows_kernel, dim3(unsigned(tiles), unsigned(gy)), 256, 0, stream())(
      ptr<bf16>(x), R, C, f == Fp8Format::E4M3, q, s, partial);
  LNS_CUDA_LAUNCHED();
  if (!record) return;
  LNS_LAUNCH(fp8_record_kernel, 1, kRecordThreads, 0, stream())(row, partial, R * tiles, static_cast<float>(R * C));
  LNS_CUDA_LAUNCHED();
}

void fp8_cast_tiles_cols(const Tensor& x, Fp8Format f, uint8_t* qT, float* s) {
  const ProfileSegment segment("fp8_cast");  // its own row of the op profile
  expect(x, DType::BF16, "fp8_cast_tiles_cols x");
  const int64_t C = x.dim(-1), R = C == 0 ? 0 : x.numel() / C;
  if (R == 0 || C == 0) return;
  const int64_t gy = ceil_div(R, kTileK);
  LNS_CHECK(gy <= 65535) << "fp8_cast_tiles_cols: " << R << " rows is more than the grid's 65535 x 128";
  LNS_LAUNCH(fp8_tiles_cols_kernel, dim3(unsigned(ceil_div(C, 32)), unsigned(gy)), 256, 0, stream())(
      ptr<bf16>(x), R, C, f == Fp8Format::E4M3, qT, s);
  LNS_CUDA_LAUNCHED();
}

void fp8_cast_tiles_blocks(const Tensor& w, float* row, Fp8Format f, bool record, uint8_t* q, uint8_t* qT, float* s,
                           float* sT) {
  const ProfileSegment segment("fp8_cast");  // its own row of the op profile
  expect(w, DType::BF16, "fp8_cast_tiles_blocks w");
  const int64_t C = w.dim(-1), R = C == 0 ? 0 : w.numel() / C;
  if (R == 0 || C == 0) return;
  const int64_t gx = ceil_div(C, kTileK), gy = ceil_div(R, kTileK);
  LNS_CHECK(gy <= 65535) << "fp8_cast_tiles_blocks: " << R << " rows is more than the grid's 65535 x 128";
  auto* partial = static_cast<float*>(scratch(Scratch::Fp8Partials, sizeof(float) * kStats * gx * gy));
  LNS_LAUNCH(fp8_tiles_blocks_kernel, dim3(unsigned(gx), unsigned(gy)), 256, 0, stream())(
      ptr<bf16>(w), R, C, f == Fp8Format::E4M3, q, qT, s, sT, partial);
  LNS_CUDA_LAUNCHED();
  if (!record) return;
  LNS_LAUNCH(fp8_record_kernel, 1, kRecordThreads, 0, stream())(row, partial, gx * gy, static_cast<float>(R * C));
  LNS_CUDA_LAUNCHED();
}

void fp8_cast(const Tensor& x, float* row, Fp8Format f, bool record, uint8_t* q, uint8_t* qT) {
  const ProfileSegment segment("fp8_cast");  // its own row of the op profile
  expect(x, DType::BF16, "fp8_cast x");
  const int64_t C = x.dim(-1), R = C == 0 ? 0 : x.numel() / C;
  if (R == 0 || C == 0) return;
  const int64_t gx = ceil_div(C, kTile), gy = ceil_div(R, kTile);
  LNS_CHECK(gy <= 65535) << "fp8_cast: " << R << " rows is more than the grid's 65535 x 32";
  auto* partial = static_cast<float*>(scratch(Scratch::Fp8Partials, sizeof(float) * kStats * gx * gy));
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
  LNS_LAUNCH(fp8_cast_kernel, grid, kThreads, 0, stream())(ptr<bf16>(x), R, C, row, f == Fp8Format::E4M3, q, qT,
                                                          partial);
  LNS_CUDA_LAUNCHED();
  if (!record) return;
  LNS_LAUNCH(fp8_record_kernel, 1, kRecordThreads, 0, stream())(row, partial, gx * gy, static_cast<float>(R * C));
  LNS_CUDA_LAUNCHED();
}

}  // namespace lns::cuda
