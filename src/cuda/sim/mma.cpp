// mma.sync.m16n8k16 (bf16 in, f32 accumulate) for the emulation build; see mma.h.
//
// Fragment layouts, transcribed from the PTX ISA (section "Matrix Fragments for
// mma.m16n8k16 with floating point type"), with groupID = lane / 4 and
// threadID_in_group = lane % 4:
//   A (16x16, .row): element i of a lane's 8 (a0..a7, two per .b32 register, a0 in
//     the low half of the first register)
//       row = groupID + 8 * ((i / 2) % 2)
//       col = threadID_in_group * 2 + i % 2 + 8 * (i / 4)
//   B (16x8, .col): element i of 4 (b0..b3)
//       row (k) = threadID_in_group * 2 + i % 2 + 8 * (i / 2)
//       col (n) = groupID
//   C, D (16x8 f32): element i of 4 (c0..c3)
//       row = groupID + 8 * (i / 2)
//       col = threadID_in_group * 2 + i % 2
#include "cuda/sim/mma.h"

#include <cstring>

#include "cuda/sim/sim_api.h"

namespace lns::sim {
namespace {

float bf16_bits_to_f32(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Element i (0..2n-1) of n packed .b32 registers: the low half is the even one.
float unpack(const uint32_t* regs, int i) {
  return bf16_bits_to_f32(static_cast<uint16_t>(regs[i / 2] >> (16 * (i % 2))));
}

}  // namespace

void mma_m16n8k16_bf16_body(void* const lanes[32], void* /*ctx*/) {
  float A[16][16], B[16][8], C[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const auto* l = static_cast<const MmaLane*>(lanes[lane]);
    if (l == nullptr) fail("mma.sync.m16n8k16: lane " + std::to_string(lane) + " did not take part");
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 8; ++i) A[g + 8 * ((i / 2) % 2)][t * 2 + i % 2 + 8 * (i / 4)] = unpack(l->a, i);
    for (int i = 0; i < 4; ++i) B[t * 2 + i % 2 + 8 * (i / 2)][g] = unpack(l->b, i);
    for (int i = 0; i < 4; ++i) C[g + 8 * (i / 2)][t * 2 + i % 2] = l->cd[i];
  }
  // Products of two bf16 are exact in f32; the sum of 16 of them and C is formed in
  // double and rounded once. The hardware's internal order and rounding are not
  // documented: results can differ from a GPU's in the last bits (docs/cuda.md).
  float D[16][8];
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 8; ++c) {
      double s = C[r][c];
      for (int k = 0; k < 16; ++k) s += double(A[r][k]) * double(B[k][c]);
      D[r][c] = static_cast<float>(s);
    }
  for (int lane = 0; lane < 32; ++lane) {
    auto* l = static_cast<MmaLane*>(lanes[lane]);
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) l->cd[i] = D[g + 8 * (i / 2)][t * 2 + i % 2];
  }
}

void mma_m16n8k16_bf16(float cd[4], const uint32_t a[4], const uint32_t b[2]) {
  MmaLane lane{cd, a, b};
  // .aligned: all 32 lanes execute the same mma.sync, converged.
  warp_collective(0xffffffffu, &lane, mma_m16n8k16_bf16_body, nullptr, "mma.sync.m16n8k16");
}

}  // namespace lns::sim
