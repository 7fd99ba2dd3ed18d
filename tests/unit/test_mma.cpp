// The emulated mma.sync.m16n8k16 (src/cuda/sim/mma.cpp) against a plain f64 matrix
// product, with the operands spread over 32 lanes exactly as the PTX ISA's fragment
// figures for mma.m16n8k16 (.bf16, f32 accumulators) show them. Runs in the normal CPU
// build: a stub warp_collective below gathers the 32 lanes' calls and runs the body
// once the last lane has arrived, as the emulator's runtime does for a converged warp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>

#include "cuda/sim/mma.h"
#include "cuda/sim/sim_api.h"

namespace lns::sim {
// ---- stubs of the runtime (sim_api.h) --------------------------------------------
namespace {
// The runtime's lanes are fibers that wait inside the call, so their lane data stays
// alive until the body ran; here each call returns at once, so the stub keeps a copy
// (the only collective this test drives is the mma, whose lane data is an MmaLane).
MmaLane g_copies[32];
void* g_lanes[32];
unsigned g_arrived = 0;
}  // namespace
[[noreturn]] void fail(const std::string& message) { throw std::runtime_error(message); }
void warp_collective(unsigned mask, void* lane_data, void (*body)(void* const lanes[32], void* ctx), void* ctx,
                     const char* /*what*/) {
  // The test calls lanes 0..31 in order; lane l is the l-th call since the last body.
  const int lane = __builtin_popcount(g_arrived);
  g_copies[lane] = *static_cast<const MmaLane*>(lane_data);
  g_lanes[lane] = &g_copies[lane];
  g_arrived |= 1u << lane;
  if (g_arrived == mask) {
    body(g_lanes, ctx);
    g_arrived = 0;
  }
}
}  // namespace lns::sim

namespace {

uint16_t to_bf16_bits(float f) {  // round to nearest even (inputs are finite)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float bf16_value(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t pack(uint16_t lo, uint16_t hi) { return uint32_t{lo} | uint32_t{hi} << 16; }

struct Operands {
  uint16_t A[16][16], B[16][8];  // bf16 bits, A row-major (m x k), B (k x n)
  float C[16][8];
  explicit Operands(unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (auto& r : A)
      for (auto& x : r) x = to_bf16_bits(n(rng));
    for (auto& r : B)
      for (auto& x : r) x = to_bf16_bits(n(rng));
    for (auto& r : C)
      for (auto& x : r) x = n(rng);
  }
};

// Per lane, as the PTX ISA figures give them (groupID g = lane / 4,
// threadID_in_group t = lane % 4):
//   A: {a0,a1} = A[g][2t, 2t+1], {a2,a3} = A[g+8][2t, 2t+1],
//      {a4,a5} = A[g][2t+8, 2t+9], {a6,a7} = A[g+8][2t+8, 2t+9]
//   B: {b0,b1} = B[2t, 2t+1][g], {b2,b3} = B[2t+8, 2t+9][g]
//   C: {c0,c1} = C[g][2t, 2t+1], {c2,c3} = C[g+8][2t, 2t+1]
struct Lane {
  uint32_t a[4], b[2];
  float cd[4];
};
void distribute(const Operands& o, Lane lanes[32]) {
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    Lane& x = lanes[l];
    x.a[0] = pack(o.A[g][2 * t], o.A[g][2 * t + 1]);
    x.a[1] = pack(o.A[g + 8][2 * t], o.A[g + 8][2 * t + 1]);
    x.a[2] = pack(o.A[g][2 * t + 8], o.A[g][2 * t + 9]);
    x.a[3] = pack(o.A[g + 8][2 * t + 8], o.A[g + 8][2 * t + 9]);
    x.b[0] = pack(o.B[2 * t][g], o.B[2 * t + 1][g]);
    x.b[1] = pack(o.B[2 * t + 8][g], o.B[2 * t + 9][g]);
    x.cd[0] = o.C[g][2 * t], x.cd[1] = o.C[g][2 * t + 1];
    x.cd[2] = o.C[g + 8][2 * t], x.cd[3] = o.C[g + 8][2 * t + 1];
  }
}

TEST(MmaSim, FragmentLayoutsGiveThePlainProduct) {
  for (unsigned seed = 1; seed <= 5; ++seed) {
    const Operands o(seed);
    Lane lanes[32];
    distribute(o, lanes);
    for (auto& l : lanes) lns::sim::mma_m16n8k16_bf16(l.cd, l.a, l.b);
    double worst = 0.0;
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      for (int i = 0; i < 4; ++i) {
        const int r = g + 8 * (i / 2), c = 2 * t + i % 2;
        double want = o.C[r][c];
        for (int k = 0; k < 16; ++k) want += double(bf16_value(o.A[r][k])) * bf16_value(o.B[k][c]);
        worst = std::max(worst, std::abs(lanes[l].cd[i] - want) / (1.0 + std::abs(want)));
      }
    }
    EXPECT_LE(worst, 1e-6) << "seed " << seed;  // one f32 rounding of an exact sum
  }
}

// A layout mistake must show: swapping the two halves of one A register of one lane
// (a0 <-> a1 of lane 5) changes exactly the outputs of row 1 (g = 1).
TEST(MmaSim, MisplacedFragmentChangesTheProduct) {
  const Operands o(7);
  Lane good[32], bad[32];
  distribute(o, good);
  distribute(o, bad);
  bad[5].a[0] = (bad[5].a[0] >> 16) | (bad[5].a[0] << 16);
  for (auto& l : good) lns::sim::mma_m16n8k16_bf16(l.cd, l.a, l.b);
  for (auto& l : bad) lns::sim::mma_m16n8k16_bf16(l.cd, l.a, l.b);
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 4; ++i) {
      const int row = l / 4 + 8 * (i / 2);
      if (row == 1)
        EXPECT_NE(good[l].cd[i], bad[l].cd[i]) << "lane " << l << " c" << i;
      else
        EXPECT_EQ(good[l].cd[i], bad[l].cd[i]) << "lane " << l << " c" << i;
    }
}

// Exactness on small integers: every product and sum is representable.
TEST(MmaSim, IdentityTimesBIsB) {
  Operands o(3);
  for (int r = 0; r < 16; ++r)
    for (int k = 0; k < 16; ++k) o.A[r][k] = to_bf16_bits(r == k ? 1.0f : 0.0f);
  for (auto& r : o.C)
    for (auto& x : r) x = 0.5f;
  Lane lanes[32];
  distribute(o, lanes);
  for (auto& l : lanes) lns::sim::mma_m16n8k16_bf16(l.cd, l.a, l.b);
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 4; ++i) {
      const int r = l / 4 + 8 * (i / 2), c = 2 * (l % 4) + i % 2;
      EXPECT_EQ(lanes[l].cd[i], bf16_value(o.B[r][c]) + 0.5f);
    }
}

// A warp with a missing lane (the runtime passes nullptr for it) is reported.
TEST(MmaSim, MissingLaneIsReported) {
  Lane lanes[32];
  distribute(Operands(1), lanes);
  lns::sim::MmaLane ml[32];
  void* ptrs[32];
  for (int l = 0; l < 32; ++l) ml[l] = {lanes[l].cd, lanes[l].a, lanes[l].b}, ptrs[l] = &ml[l];
  ptrs[17] = nullptr;
  try {
    lns::sim::mma_m16n8k16_bf16_body(ptrs, nullptr);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("lane 17"), std::string::npos) << e.what();
  }
}

}  // namespace
