// Tensor cores for the fused kernels, behind one small wrapper: a warp computes
// D[16x8] += A[16x16] B[16x8] with bf16 inputs and f32 accumulation
// (mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, sm_80 and sm_90), plus the
// loads that place shared-memory tiles into the fragments as the PTX ISA lays them
// out. Under -DLNS_CUDA_SIM the instruction is the emulator's warp-collective
// (src/cuda/sim/mma.cpp, the layouts written out there); the loads below are the same
// code in both builds, so the emulated kernels check them.
//
// Lane l of the warp: g = l / 4 (groupID), t = l % 4 (threadID_in_group).
//   A 16x16 row-major: r[0] = A[g][2t..2t+1],   r[1] = A[g+8][2t..2t+1],
//                      r[2] = A[g][2t+8..+9],   r[3] = A[g+8][2t+8..+9]
//   B 16x8 (k x n):    r[0] = B[2t..2t+1][g],   r[1] = B[2t+8..2t+9][g]
//   C 16x8 f32:        r[0..1] = C[g][2t..2t+1], r[2..3] = C[g+8][2t..2t+1]
// Two bf16 per 32-bit register, the lower index in the low half.
#pragma once
#include <cstdint>
#include <cstring>

#include "cuda/common.cuh"
#ifdef LNS_CUDA_SIM
#include "cuda/sim/mma.h"
#endif

namespace lns::cuda {

struct FragA { uint32_t r[4]; };
struct FragB { uint32_t r[2]; };
struct FragC { float r[4]; };

// d += a b (one warp, all 32 lanes converged)
__device__ __forceinline__ void mma_16816(FragC& d, const FragA& a, const FragB& b) {
#ifdef LNS_CUDA_SIM
  ::lns::sim::mma_m16n8k16_bf16(d.r, a.r, b.r);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d.r[0]), "+f"(d.r[1]), "+f"(d.r[2]), "+f"(d.r[3])
      : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
#endif
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const bf16 h[2] = {to_bf(lo), to_bf(hi)};
  uint32_t r;
  memcpy(&r, h, 4);
  return r;
}
__device__ __forceinline__ uint32_t ld32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ uint32_t ld2x16(const bf16* lo, const bf16* hi) {
  const bf16 h[2] = {*lo, *hi};
  uint32_t r;
  memcpy(&r, h, 4);
  return r;
}

// A from a row-major tile: s points at A[0][0], rows ld elements apart (ld even).
__device__ __forceinline__ void load_a(FragA& a, const bf16* s, int ld) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  a.r[0] = ld32(s + g * ld + 2 * t);
  a.r[1] = ld32(s + (g + 8) * ld + 2 * t);
  a.r[2] = ld32(s + g * ld + 2 * t + 8);
  a.r[3] = ld32(s + (g + 8) * ld + 2 * t + 8);
}
// B from a tile stored n-major (s[n * ld + k] = B[k][n], e.g. K rows for Q K^T).
__device__ __forceinline__ void load_b_nk(FragB& b, const bf16* s, int ld) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  b.r[0] = ld32(s + g * ld + 2 * t);
  b.r[1] = ld32(s + g * ld + 2 * t + 8);
}
// B from a tile stored k-major (s[k * ld + n] = B[k][n], e.g. V rows for P V).
__device__ __forceinline__ void load_b_kn(FragB& b, const bf16* s, int ld) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  b.r[0] = ld2x16(s + (2 * t) * ld + g, s + (2 * t + 1) * ld + g);
  b.r[1] = ld2x16(s + (2 * t + 8) * ld + g, s + (2 * t + 9) * ld + g);
}
// A from two accumulator tiles (columns 0..7 in lo, 8..15 in hi), rounded to bf16:
// how a product (P, dS) becomes the left operand of the next product on chip.
__device__ __forceinline__ FragA a_from_c(const FragC& lo, const FragC& hi) {
  FragA a;
  a.r[0] = pack_bf16(lo.r[0], lo.r[1]);
  a.r[1] = pack_bf16(lo.r[2], lo.r[3]);
  a.r[2] = pack_bf16(hi.r[0], hi.r[1]);
  a.r[3] = pack_bf16(hi.r[2], hi.r[3]);
  return a;
}

}  // namespace lns::cuda
