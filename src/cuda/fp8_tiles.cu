// --fp8=blockwise's FP8 casts (src/cuda/fp8_tiles.h): tiles of 128 along K, each with its
// own power-of-two scale (include/lns/core/fp8_recipe.h; CPU reference quantize_tiles in
// src/cpu/fp8_linear.cpp). The factor written for a tile is 1/s (exact), in the layouts
// cuda/gemm.h states for GemmScale::Vec128 and Block128; their padding is left unwritten
// (never read). What they share with the per-tensor casts: src/cuda/fp8_common.cuh.
#include <algorithm>

#include "cuda/fp8_common.cuh"
#include "cuda/fp8_tiles.h"
#include "cuda/op_profile.h"

namespace lns::cuda {
namespace {

constexpr int kTileK = static_cast<int>(kFp8Tile);  // the recipe's tile edge (lns/core/fp8_recipe.h)

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

// fp8_tiles_rows' vector path (C % 8 == 0, x 16-byte aligned, q 8-byte aligned): a
// half-warp per 1 x 128 tile, 8 values a lane in one 16-byte load; a warp takes tiles
// 2w and 2w + 1 of the R x ceil(C/128) in row-major order, for w = its global warp index,
// + the grid's warps, ...; the block's health to partial[blockIdx.x][4].
__global__ void fp8_tiles_rows_vec_kernel(const bf16* __restrict__ x, int64_t R, int64_t C, bool e4m3, uint8_t* q,
                                          float* s, float* partial, float* rec_row, float rec_elements,
                                          unsigned int* counter) {
  __shared__ float red[32];
  const Fp8Format f = e4m3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
  const int lane = threadIdx.x % 32, half = lane / 16, hl = lane % 16;
  const int64_t tiles_c = ceil_div(C, kTileK), tiles = R * tiles_c, warps_per_block = blockDim.x / 32;
  const int64_t warps = int64_t(gridDim.x) * warps_per_block;
  Fp8Health h;  // amax, flushed, non-finite: a tile's scale fits its amax, so none saturate
  for (int64_t w = int64_t(blockIdx.x) * warps_per_block + threadIdx.x / 32; 2 * w < tiles; w += warps) {
    const int64_t k = 2 * w + half;  // this half-warp's tile (the loop's bound is the warp's: no split shuffle)
    const bool live = k < tiles;
    const int64_t r = live ? k / tiles_c : 0, t = live ? k % tiles_c : 0, c = t * kTileK + hl * kVec;
    const bool mine = live && c < C;  // C % 8 == 0: the lane's 8 values are all in or all out
    float v[kVec] = {};
    if (mine) load<kVec>(x + r * C + c, v);
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      if (isfinite(v[j])) amax = fmaxf(amax, fabsf(v[j])); else h.nonfinite += 1.0f;
    for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));  // the half-warp's
    const float scale = fp8_pow2_scale(amax, f);
    h.amax = fmaxf(h.amax, amax);
    if (!mine) continue;
    Fp8x8 codes;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float sv = v[j] * scale;
      codes.v[j] = fp8_encode_satfinite(sv, f);
      if (sv != 0.0f && isfinite(sv) && (codes.v[j] & 0x7F) == 0) h.flushed += 1.0f;
    }
    *reinterpret_cast<Fp8x8*>(q + r * C + c) = codes;
    if (hl == 0) s[t * round4(R) + r] = 1.0f / scale;
  }
  h.write_block(partial, red);
  record_if_last(Fp8Record{rec_row, rec_elements, counter}, partial, red);
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

// fp8_tiles_cols' vector path (C % 8 == 0 and R % 16 == 0, x 16-byte aligned, qT 16-byte
// aligned): a block takes 128 rows x 64 columns. Thread t loads 8 columns (t % 8) of rows
// t / 8 + 32 j (j < 4) in 16-byte loads; the 64 columns' amax go through shared memory;
// the codes out through a shared tile, thread t writing column t % 64's rows 32 (t / 64)
// to + 31 as two 16-byte stores.
__global__ void fp8_tiles_cols_vec_kernel(const bf16* __restrict__ x, int64_t R, int64_t C, bool e4m3, uint8_t* qT,
                                          float* s) {
  constexpr int kCols = 64;
  __shared__ float colmax[32][kCols];           // [row group][column]
  __shared__ float colscale[kCols];
  __shared__ Fp8x8 tile[kTileK][kCols / 8];     // [row][column / 8]
  const Fp8Format f = e4m3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
  const int lc = threadIdx.x % 8 * kVec, lr = threadIdx.x / 8;
  const int64_t c0 = int64_t(blockIdx.x) * kCols, r0 = int64_t(blockIdx.y) * kTileK, c = c0 + lc;
  float v[4][kVec], amax[kVec] = {};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t r = r0 + lr + 32 * j;
    if (r < R && c < C) load<kVec>(x + r * C + c, v[j]);
    else for (int k = 0; k < kVec; ++k) v[j][k] = 0.0f;
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      if (isfinite(v[j][k])) amax[k] = fmaxf(amax[k], fabsf(v[j][k]));
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) colmax[lr][lc + k] = amax[k];
  __syncthreads();
  if (threadIdx.x < kCols) {
    float m = 0.0f;
    for (int g = 0; g < 32; ++g) m = fmaxf(m, colmax[g][threadIdx.x]);
    const float scale = fp8_pow2_scale(m, f);
    colscale[threadIdx.x] = scale;
    if (c0 + threadIdx.x < C) s[int64_t(blockIdx.y) * round4(C) + c0 + threadIdx.x] = 1.0f / scale;
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    Fp8x8 codes;
#pragma unroll
    for (int k = 0; k < kVec; ++k) codes.v[k] = fp8_encode_satfinite(v[j][k] * colscale[lc + k], f);
    tile[lr + 32 * j][lc / 8] = codes;
  }
  __syncthreads();
  const int tj = threadIdx.x % kCols, tr = threadIdx.x / kCols * 32;
  if (c0 + tj >= C) return;
#pragma unroll
  for (int part = 0; part < 2; ++part) {
    const int64_t r = r0 + tr + 16 * part;  // R % 16 == 0: the 16 rows are all in or all out
    if (r < R) store_column16(tile, tr + 16 * part, tj, qT + (c0 + tj) * R + r);
  }
}

// The end of a 128 x 128 tile (block (tc, tr) of the grid): its factor 1/scale into s and
// sT (either may be null) and its health, the block's flushed and non-finite counts summed
// (every thread must call it), into partial[tile][4]. None saturate: the scale fits amax.
__device__ __forceinline__ void finish_block_tile(float* s, float* sT, float* partial, float scale, float amax,
                                                  float flushed, float nonfinite, float* red) {
  flushed = block_sum(flushed, red), nonfinite = block_sum(nonfinite, red);
  if (threadIdx.x != 0) return;
  const int64_t tc = blockIdx.x, tr = blockIdx.y;
  if (s) s[tr * round4(gridDim.x) + tc] = 1.0f / scale;
  if (sT) sT[tc * round4(gridDim.y) + tr] = 1.0f / scale;
  float* p = partial + (tr * gridDim.x + tc) * kStats;
  p[0] = amax, p[1] = 0.0f, p[2] = flushed, p[3] = nonfinite;
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
  finish_block_tile(s, sT, partial, scale, amax, flushed, nonfinite, red);
}

// fp8_tiles_blocks' vector path (C % 8 == 0, x 16-byte aligned, q 8-byte aligned; with
// qT also R % 16 == 0 and qT 16-byte aligned): one block per 128 x 128 tile as above, the
// tile held in registers (thread t: 8 columns (t % 16) of rows t / 16 + 16 j, j < 8, in
// 16-byte loads), its codes out through a shared tile so that qT is written 16 bytes at a
// time (thread t: column t % 128, rows 64 (t / 128) to + 63). The scalar kernel wrote qT
// a byte at a time down its columns.
__global__ void fp8_tiles_blocks_vec_kernel(const bf16* __restrict__ x, int64_t R, int64_t C, bool e4m3, uint8_t* q,
                                            uint8_t* qT, float* s, float* sT, float* partial) {
  constexpr int kRows = 8;                        // rows a thread loads
  __shared__ Fp8x8 tile[kTileK][kTileK / 8];     // [row][column / 8], 16 KiB
  __shared__ float red[32];
  const Fp8Format f = e4m3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
  const int64_t tc = blockIdx.x, tr = blockIdx.y, r0 = tr * kTileK, c0 = tc * kTileK;
  const int lc = threadIdx.x % 16 * kVec, lr = threadIdx.x / 16;
  const bool col_in = c0 + lc < C;  // C % 8 == 0: the 8 columns are all in or all out
  Bf16x8 raw[kRows];
  float amax = 0.0f, nonfinite = 0.0f, flushed = 0.0f;
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    const int64_t r = r0 + lr + 16 * j;
    const bool in = col_in && r < R;
    if (in) raw[j] = *reinterpret_cast<const Bf16x8*>(x + r * C + c0 + lc);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float v = in ? to_f(raw[j].v[k]) : 0.0f;
      if (isfinite(v)) amax = fmaxf(amax, fabsf(v)); else nonfinite += 1.0f;
    }
  }
  amax = block_max(amax, red);
  const float scale = fp8_pow2_scale(amax, f);
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    const int64_t r = r0 + lr + 16 * j;
    if (!col_in || r >= R) continue;
    Fp8x8 codes;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float sv = to_f(raw[j].v[k]) * scale;
      codes.v[k] = fp8_encode_satfinite(sv, f);
      if (sv != 0.0f && isfinite(sv) && (codes.v[k] & 0x7F) == 0) flushed += 1.0f;
    }
    if (q) *reinterpret_cast<Fp8x8*>(q + r * C + c0 + lc) = codes;
    tile[lr + 16 * j][lc / 8] = codes;
  }
  if (qT) {
    __syncthreads();
    const int tj = threadIdx.x % kTileK, tr0 = threadIdx.x / kTileK * 64;
    if (c0 + tj < C) {
#pragma unroll
      for (int part = 0; part < 4; ++part) {
        const int64_t r = r0 + tr0 + 16 * part;  // R % 16 == 0: the 16 rows are all in or all out
        if (r >= R) break;
        store_column16(tile, tr0 + 16 * part, tj, qT + (c0 + tj) * R + r);
      }
    }
  }
  finish_block_tile(s, sT, partial, scale, amax, flushed, nonfinite, red);
}

}  // namespace

void fp8_cast_tiles_rows(const Tensor& x, float* row, Fp8Format f, bool record, uint8_t* q, float* s) {
  const ProfileSegment segment("fp8_cast");  // its own row of the op profile
  expect(x, DType::BF16, "fp8_cast_tiles_rows x");
  const int64_t C = x.dim(-1), R = C == 0 ? 0 : x.numel() / C;
  if (R == 0 || C == 0) return;
  const int64_t tiles = ceil_div(C, kTileK);
  if (vec_ok(x.data, C) && aligned_to(q, 8)) {  // 16 tiles a block a pass (8 warps, 2 each)
    const int64_t blocks = std::min<int64_t>(ceil_div(R * tiles, 16), kCastBlocks);
    const Fp8Partials p = partials_for(blocks, record ? row : nullptr, R * C);
    LNS_LAUNCH(fp8_tiles_rows_vec_kernel, unsigned(blocks), 256, 0, stream())(
        ptr<bf16>(x), R, C, f == Fp8Format::E4M3, q, s, p.partial, p.rec.row, p.rec.elements,
        p.rec.counter);  // recorded by its last block
    LNS_CUDA_LAUNCHED();
    return;
  }
  const int64_t gy = ceil_div(R, 8);
  LNS_CHECK(gy <= 65535) << "fp8_cast_tiles_rows: " << R << " rows is more than the grid's 65535 x 8";
  const Fp8Partials p = partials_for(R * tiles, record ? row : nullptr, R * C);
  LNS_LAUNCH(fp8_tiles_rows_kernel, dim3(unsigned(tiles), unsigned(gy)), 256, 0, stream())(
      ptr<bf16>(x), R, C, f == Fp8Format::E4M3, q, s, p.partial);
  LNS_CUDA_LAUNCHED();
  record_partials(p, R * tiles);
}

void fp8_cast_tiles_cols(const Tensor& x, Fp8Format f, uint8_t* qT, float* s) {
  const ProfileSegment segment("fp8_cast");  // its own row of the op profile
  expect(x, DType::BF16, "fp8_cast_tiles_cols x");
  const int64_t C = x.dim(-1), R = C == 0 ? 0 : x.numel() / C;
  if (R == 0 || C == 0) return;
  const int64_t gy = ceil_div(R, kTileK);
  LNS_CHECK(gy <= 65535) << "fp8_cast_tiles_cols: " << R << " rows is more than the grid's 65535 x 128";
  if (vec_ok(x.data, C) && R % 16 == 0 && aligned_to(qT, 16))
    LNS_LAUNCH(fp8_tiles_cols_vec_kernel, dim3(unsigned(ceil_div(C, 64)), unsigned(gy)), 256, 0, stream())(
        ptr<bf16>(x), R, C, f == Fp8Format::E4M3, qT, s);
  else
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
  const Fp8Partials p = partials_for(gx * gy, record ? row : nullptr, R * C);  // once a step: recorded apart
  if (vec_ok(w.data, C) && (!q || aligned_to(q, 8)) && (!qT || (R % 16 == 0 && aligned_to(qT, 16))))
    LNS_LAUNCH(fp8_tiles_blocks_vec_kernel, dim3(unsigned(gx), unsigned(gy)), 256, 0, stream())(
        ptr<bf16>(w), R, C, f == Fp8Format::E4M3, q, qT, s, sT, p.partial);
  else
    LNS_LAUNCH(fp8_tiles_blocks_kernel, dim3(unsigned(gx), unsigned(gy)), 256, 0, stream())(
        ptr<bf16>(w), R, C, f == Fp8Format::E4M3, q, qT, s, sT, p.partial);
  LNS_CUDA_LAUNCHED();
  record_partials(p, gx * gy);
}

}  // namespace lns::cuda
