// What the FP8 casts of the CUDA backend share: the per-tensor casts (src/cuda/fp8_cast.cu)
// and --fp8=blockwise's tiled casts (src/cuda/fp8_tiles.cu). Codes stored 8 and 16 at a
// time, the transposes' column store, a thread's share of a cast's health, and how that
// health reaches the cast's row of the FP8 table without atomics: every block (or tile)
// writes its partial, and the grid's last block (the vector kernels) or the record kernel
// (the scalar ones) merges the partials in index order.
#pragma once
#include <cstdint>

#include "cuda/common.cuh"
#include "lns/core/fp8_linear.h"

namespace lns::cuda {

constexpr int kStats = 4;  // a partial: amax, saturated, flushed, non-finite

// The vector paths (every cast of a model's linears: rows of a multiple of 8 values):
// 16-byte loads of 8 bf16, 8- or 16-byte stores of codes, and a grid fixed by the shape
// and capped at kCastBlocks blocks that stride over the tiles, so that each block reduces
// its health once (the scalar kernels reduce per 32 x 32 tile: 4 block reductions per
// 1,024 values) and the record kernel reads at most kCastBlocks partials (one block reading
// 16k of them took longer than the cast). The grid depends on the shape alone: the same
// partials, the same bits, on every run.
constexpr int kCastBlocks = 1024;
struct alignas(8) Fp8x8 {
  uint8_t v[8];
};
struct alignas(16) Fp8x16 {
  uint8_t v[16];
};
inline bool aligned_to(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// The transposes' store: column `col` of a shared tile of codes ([rows][W8 x 8 bytes]),
// rows row0 to row0 + 15, as one 16-byte store at dst (16-byte aligned).
template <int W8>
__device__ __forceinline__ void store_column16(const Fp8x8 (*tile)[W8], int row0, int col, uint8_t* dst) {
  Fp8x16 out;
#pragma unroll
  for (int i = 0; i < 16; ++i) out.v[i] = tile[row0 + i][col / 8].v[col % 8];
  *reinterpret_cast<Fp8x16*>(dst) = out;
}

// A thread's share of a per-tensor cast's health (the counts of lns::cast_to_fp8): the
// amax of the finite inputs, and how many saturate, flush to zero or are not finite.
struct Fp8Health {
  float amax = 0.0f, sat = 0.0f, flushed = 0.0f, nonfinite = 0.0f;
  __device__ __forceinline__ uint8_t cast(float v, float scale, float limit, Fp8Format f) {
    if (isfinite(v)) amax = fmaxf(amax, fabsf(v)); else nonfinite += 1.0f;
    const float s = v * scale;
    const uint8_t code = fp8_encode_satfinite(s, f);
    if (isfinite(s) && fabsf(s) > limit) sat += 1.0f;
    if (s != 0.0f && isfinite(s) && (code & 0x7F) == 0) flushed += 1.0f;
    return code;
  }
  // The block's health to partial[blockIdx.x][4] (every thread must call it).
  __device__ __forceinline__ void write_block(float* partial, float* red) {
    const float a = block_max(amax, red), s = block_sum(sat, red), fl = block_sum(flushed, red),
                nf = block_sum(nonfinite, red);
    if (threadIdx.x == 0) {
      float* p = partial + int64_t(blockIdx.x) * kStats;
      p[0] = a, p[1] = s, p[2] = fl, p[3] = nf;
    }
  }
};

// row += the partials' health (a vector path's blocks, at most kCastBlocks; the scalar
// kernels' tiles). One block: thread t takes partials t, t + 256, ... in order, then the
// block reduces in its fixed order, so the sums do not depend on timing.
// The merge itself, by one block of any size (the partials read volatile: in the vector
// kernels' last block they were written by other blocks of the same grid).
__device__ __forceinline__ void merge_health(float* row, const volatile float* partial, int64_t n, float elements,
                                             float* red) {
  float amax = 0.0f, sat = 0.0f, flushed = 0.0f, nonfinite = 0.0f;
  for (int64_t t = threadIdx.x; t < n; t += blockDim.x) {
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

// Where the vector kernels record: the table row (null: not recorded), the cast's element
// count, and the grid's ticket counter (0 between casts: the last block resets it). The
// kernels take the three as arguments of their own, so that the emulator sees every
// pointer a kernel writes through (its reversed-order check restores them).
struct Fp8Record {
  float* row = nullptr;
  float elements = 0.0f;
  unsigned int* counter = nullptr;
};

// After every block wrote its partial[blockIdx.x]: the last block to finish merges all
// gridDim.x partials into the row, in index order (the same bits whichever block is last).
// Saves the record kernel's launch after each of the ~15 casts a block and micro-batch.
// `red` is the block's reduction buffer: red[0] carries whether this block is the last.
__device__ __forceinline__ void record_if_last(const Fp8Record& rec, const float* partial, float* red) {
  if (!rec.row) return;
  __threadfence();  // this block's partial is visible before its ticket is taken
  __syncthreads();  // and every thread has read `red` in the reductions before
  if (threadIdx.x == 0) red[0] = atomicAdd(rec.counter, 1u) == gridDim.x - 1 ? 1.0f : 0.0f;
  __syncthreads();
  if (red[0] == 0.0f) return;  // uniform over the block
  __threadfence();
  merge_health(rec.row, partial, gridDim.x, rec.elements, red);  // its reductions sync before reusing red
  if (threadIdx.x == 0) *rec.counter = 0;
}

// Every cast's partials [n][4] and the vector kernels' ticket counter, in one scratch
// buffer: the counter first (16 bytes), zeroed whenever the buffer is new (the last block
// of every vector grid leaves it at 0), the partials after it.
struct Fp8Partials {
  float* partial;
  Fp8Record rec;  // for a vector kernel that records: the row, the element count, the counter
};
// The partials of a cast of n blocks or tiles, and its record (row null: not recorded).
// Defined once, in fp8_cast.cu: every cast takes them from the same scratch buffer, and
// whether that buffer's counter is zeroed is noted in one place.
Fp8Partials partials_for(int64_t n, float* row, int64_t elements);
// The scalar kernels' record: one block merges their n partials into the row.
void record_partials(const Fp8Partials& p, int64_t n);

}  // namespace lns::cuda
