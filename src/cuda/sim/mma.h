// The emulation of the warp-collective tensor-core instruction that src/cuda/mma.cuh
// wraps: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, with the fragment
// layouts of the PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point
// type"). Plain C++: no CUDA header needed. Used by the -DLNS_CUDA_SIM build only.
#pragma once
#include <cstdint>

namespace lns::sim {

// One lane's part of D = A B + C for a 16x16 (row-major) A, a 16x8 (column-major) B
// and a 16x8 f32 C/D, each spread over the 32 lanes of the warp as the PTX ISA says:
//   a[4]: 8 bf16 of A (two per register, the lower column in the low half)
//   b[2]: 4 bf16 of B (two per register, the lower k in the low half)
//   cd[4]: 4 f32 of C on entry, of D on return
// Every lane of the warp must call it, converged (sim_api.h warp_collective); the
// result appears in every lane's cd when all 32 have arrived.
void mma_m16n8k16_bf16(float cd[4], const uint32_t a[4], const uint32_t b[2]);

// What each lane hands to the collective, and the collective's body (exposed so a
// unit test can drive it with 32 lanes of its own).
struct MmaLane {
  float* cd;
  const uint32_t* a;
  const uint32_t* b;
};
void mma_m16n8k16_bf16_body(void* const lanes[32], void* ctx);

}  // namespace lns::sim
