// The FP8 cast kernels of src/cuda/fp8_cast.cu and fp8_tiles.cu, each path, against the CPU's cast rule (label
// `gpu`; emulated in CI): per-tensor (lns::cast_to_fp8: the codes and the health counts)
// and the blockwise tiles (each tile's scale fp8_pow2_scale of its amax, then
// fp8_encode_satfinite: lns/core/fp8_format.h, themselves tested against f32_to_fp8). The shapes
// take the vector paths (rows of a multiple of 8, 16-byte aligned; with a transpose, a
// multiple of 16 rows) and the scalar ones, cross tile edges, and the largest ones give
// the vector kernels more tiles than blocks (kCastBlocks), so blocks stride. The kernels
// exist in CUDA and emulation builds only; a CPU build compiles this file to nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "lns/core/bf16.h"
#include "lns/core/device.h"
#include "lns/core/fp8_format.h"
#include "lns/core/fp8_linear.h"

#ifdef LNS_WITH_CUDA
#include "src/cuda/fp8_cast.h"
#include "src/cuda/fp8_tiles.h"

namespace lns {
namespace {

// bf16 values of mixed magnitude (some saturate at the scales below, some flush to
// zero), with a few infinities and NaNs.
std::vector<float> test_values(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> z(0.0f, 1.0f);
  std::uniform_int_distribution<int> mag(-12, 6);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(z(g) * std::ldexp(1.0f, mag(g))));
  for (int64_t i = 7; i < n; i += 997) v[size_t(i)] = (i / 997) % 2 ? std::numeric_limits<float>::infinity() : NAN;
  return v;
}

// A device buffer of `bytes` bytes (plus `offset`, where the view starts), as f32 storage.
struct DevBytes {
  OwnedTensor storage;
  int64_t offset;
  DevBytes(int64_t bytes, int64_t off) : storage(DType::F32, Shape{(bytes + off + 3) / 4 + 1}, Device::CUDA), offset(off) {}
  uint8_t* data() const { return static_cast<uint8_t*>(storage.t.data) + offset; }
  std::vector<uint8_t> get(int64_t bytes) const {
    std::vector<float> h(static_cast<size_t>(storage.t.numel()));
    copy_tensor(Tensor{h.data(), DType::F32, Device::CPU, storage.t.shape}, storage.t);
    std::vector<uint8_t> out(static_cast<size_t>(bytes));
    std::memcpy(out.data(), reinterpret_cast<const uint8_t*>(h.data()) + offset, size_t(bytes));
    return out;
  }
};

// x on the device as bf16 [R, C], `shift` elements into its buffer (1: not 16-byte aligned).
struct DevX {
  OwnedTensor storage;
  Tensor t;
  DevX(const std::vector<float>& v, int64_t R, int64_t C, int64_t shift)
      : storage(DType::BF16, Shape{R * C + shift}, Device::CUDA) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(v[i]);
    t = storage.t.rows(shift, shift + R * C).view({R, C});
    copy_tensor(t, Tensor{b.data(), DType::BF16, Device::CPU, Shape{R, C}});
  }
};

// An FP8 table row on the device: the scale set, the health zero.
struct DevRow {
  OwnedTensor t{DType::F32, Shape{kFp8Fields}, Device::CUDA};
  explicit DevRow(float scale) {
    std::vector<float> r(kFp8Fields, 0.0f);
    r[kFp8Scale] = scale, r[kFp8ScaleInv] = 1.0f / scale;
    copy_tensor(t.t, Tensor{r.data(), DType::F32, Device::CPU, Shape{kFp8Fields}});
  }
  float* data() const { return static_cast<float*>(t.t.data); }
  std::vector<float> get() const { return to_host_f32(t.t); }
};

struct CastCase {
  int64_t R, C;
  bool q, qT;
  int64_t x_shift, q_offset;  // x not 16-byte aligned (1); q not 8-byte aligned (4)
  const char* path;           // which kernel the case takes, for the trace
};

void PrintTo(const CastCase& c, std::ostream* os) {
  *os << c.R << "x" << c.C << (c.q ? " q" : "") << (c.qT ? " qT" : "") << " (" << c.path << ")";
}

class Fp8CastCuda : public ::testing::TestWithParam<CastCase> {};

TEST_P(Fp8CastCuda, CodesAndHealthAreTheCpuCast) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "skipped: " << cuda_unavailable_reason();
  const CastCase& k = GetParam();
  const int64_t R = k.R, C = k.C, n = R * C;
  for (const Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    SCOPED_TRACE(f == Fp8Format::E4M3 ? "E4M3" : "E5M2");
    const float scale = f == Fp8Format::E4M3 ? 64.0f : 1024.0f;
    const std::vector<float> x = test_values(n, uint32_t(R * 31 + C));
    std::vector<uint8_t> want(static_cast<size_t>(n));
    const Fp8CastStats st = cast_to_fp8(x.data(), n, scale, f, want.data());
    ASSERT_GT(st.saturated, 0) << "the case must saturate somewhere";
    if (f == Fp8Format::E4M3) {
      ASSERT_GT(st.flushed, 0) << "the case must flush somewhere";
    }
    const DevX dx(x, R, C, k.x_shift);
    const DevRow row(scale);
    DevBytes q(n, k.q_offset), qT(n, 0);
    cuda::fp8_cast(dx.t, row.data(), f, /*record=*/true, k.q ? q.data() : nullptr, k.qT ? qT.data() : nullptr);
    if (k.q) {
      EXPECT_EQ(q.get(n), want) << "q";
    }
    if (k.qT) {
      const std::vector<uint8_t> got = qT.get(n);
      int64_t wrong = 0;
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) wrong += got[size_t(c * R + r)] != want[size_t(r * C + c)];
      EXPECT_EQ(wrong, 0) << "qT: codes not the transpose of the CPU's";
    }
    const std::vector<float> h = row.get();
    EXPECT_EQ(h[kFp8Amax], st.amax);
    EXPECT_EQ(h[kFp8Saturated], float(st.saturated));
    EXPECT_EQ(h[kFp8Flushed], float(st.flushed));
    EXPECT_EQ(h[kFp8Nonfinite], float(st.nonfinite));
    EXPECT_EQ(h[kFp8Elements], float(n));
    EXPECT_EQ(h[kFp8Scale], scale) << "the cast reads the scale, never writes it";
  }
}

// 1040 x 4104: 17 x 65 = 1,105 tiles of 64 x 64 (partial at both edges), more than the
// vector kernel's 1,024 blocks.
INSTANTIATE_TEST_SUITE_P(
    Shapes, Fp8CastCuda,
    ::testing::Values(CastCase{1040, 4104, true, true, 0, 0, "vector, blocks stride"},
                      CastCase{96, 136, true, true, 0, 0, "vector"}, CastCase{100, 72, true, false, 0, 0, "vector, q only"},
                      CastCase{96, 136, false, true, 0, 0, "vector, qT only"},
                      CastCase{100, 72, true, true, 0, 0, "scalar: R % 16"}, CastCase{37, 13, true, true, 0, 0, "scalar: C % 8"},
                      CastCase{96, 136, true, true, 1, 0, "scalar: x misaligned"},
                      CastCase{96, 136, true, false, 0, 4, "scalar: q misaligned"}));

// ---- --fp8=blockwise's tiles -------------------------------------------------------------

int64_t round4(int64_t n) { return (n + 3) / 4 * 4; }

// The CPU's tiles of x[R,C]: tiles of tr x tc values, each with scale fp8_pow2_scale of
// its finite amax. codes[r*C+c]; inv[(tile row) * ld + tile column] or transposed (the
// GemmScale layouts: the factor's index runs along the operand's rows).
struct Tiles {
  std::vector<uint8_t> codes;
  std::vector<float> scale;  // [R/tr][C/tc] (ceil), the tile's scale
  float amax = 0.0f;
  int64_t flushed = 0, nonfinite = 0;
};
Tiles cpu_tiles(const std::vector<float>& x, int64_t R, int64_t C, int64_t tr, int64_t tc, Fp8Format f) {
  const int64_t gr = (R + tr - 1) / tr, gc = (C + tc - 1) / tc;
  Tiles t;
  t.codes.resize(size_t(R * C));
  t.scale.assign(size_t(gr * gc), 0.0f);
  std::vector<float> amax(size_t(gr * gc), 0.0f);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const float v = x[size_t(r * C + c)];
      float& a = amax[size_t(r / tr * gc + c / tc)];
      if (std::isfinite(v)) a = std::max(a, std::fabs(v)), t.amax = std::max(t.amax, std::fabs(v));
      else ++t.nonfinite;
    }
  for (size_t i = 0; i < amax.size(); ++i) t.scale[i] = fp8_pow2_scale(amax[i], f);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const float sv = x[size_t(r * C + c)] * t.scale[size_t(r / tr * gc + c / tc)];
      const uint8_t code = fp8_encode_satfinite(sv, f);
      t.codes[size_t(r * C + c)] = code;
      if (sv != 0.0f && std::isfinite(sv) && (code & 0x7F) == 0) ++t.flushed;
    }
  return t;
}

struct TileCase {
  int64_t R, C, x_shift;
  const char* path;
};
void PrintTo(const TileCase& c, std::ostream* os) { *os << c.R << "x" << c.C << " (" << c.path << ")"; }

class Fp8TileCastCuda : public ::testing::TestWithParam<TileCase> {};

// 1 x 128 along C: q[R,C], s [ceil(C/128)][round4(R)] = 1/scale; the health recorded.
TEST_P(Fp8TileCastCuda, RowTilesAreTheCpuTiles) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "skipped: " << cuda_unavailable_reason();
  const auto [R, C, shift, path] = GetParam();
  for (const Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    SCOPED_TRACE(f == Fp8Format::E4M3 ? "E4M3" : "E5M2");
    const std::vector<float> x = test_values(R * C, uint32_t(R + 7 * C));
    const Tiles want = cpu_tiles(x, R, C, 1, kFp8Tile, f);
    if (f == Fp8Format::E4M3) {
      ASSERT_GT(want.flushed, 0) << "the case must flush somewhere";
    }
    const int64_t gc = (C + kFp8Tile - 1) / kFp8Tile, ld = round4(R);
    const DevX dx(x, R, C, shift);
    const DevRow row(1.0f);
    DevBytes q(R * C, 0), s(4 * gc * ld, 0);
    cuda::fp8_cast_tiles_rows(dx.t, row.data(), f, /*record=*/true, q.data(), reinterpret_cast<float*>(s.data()));
    EXPECT_EQ(q.get(R * C), want.codes);
    const std::vector<uint8_t> sb = s.get(4 * gc * ld);
    int64_t wrong = 0;
    for (int64_t r = 0; r < R; ++r)
      for (int64_t t = 0; t < gc; ++t) {
        float got;
        std::memcpy(&got, sb.data() + 4 * (t * ld + r), 4);
        wrong += got != 1.0f / want.scale[size_t(r * gc + t)];
      }
    EXPECT_EQ(wrong, 0) << "tile factors";
    const std::vector<float> h = row.get();
    EXPECT_EQ(h[kFp8Amax], want.amax);
    EXPECT_EQ(h[kFp8Saturated], 0.0f);
    EXPECT_EQ(h[kFp8Flushed], float(want.flushed));
    EXPECT_EQ(h[kFp8Nonfinite], float(want.nonfinite));
    EXPECT_EQ(h[kFp8Elements], float(R * C));
  }
}

// 128 x 1 down R, transposed: qT[C,R], s [ceil(R/128)][round4(C)]; not recorded.
TEST_P(Fp8TileCastCuda, ColumnTilesAreTheCpuTilesTransposed) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "skipped: " << cuda_unavailable_reason();
  const auto [R, C, shift, path] = GetParam();
  for (const Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    SCOPED_TRACE(f == Fp8Format::E4M3 ? "E4M3" : "E5M2");
    const std::vector<float> x = test_values(R * C, uint32_t(3 * R + C));
    const Tiles want = cpu_tiles(x, R, C, kFp8Tile, 1, f);
    const int64_t gr = (R + kFp8Tile - 1) / kFp8Tile, ld = round4(C);
    const DevX dx(x, R, C, shift);
    DevBytes qT(R * C, 0), s(4 * gr * ld, 0);
    cuda::fp8_cast_tiles_cols(dx.t, f, qT.data(), reinterpret_cast<float*>(s.data()));
    const std::vector<uint8_t> got = qT.get(R * C), sb = s.get(4 * gr * ld);
    int64_t wrong = 0, wrong_s = 0;
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) wrong += got[size_t(c * R + r)] != want.codes[size_t(r * C + c)];
    for (int64_t t = 0; t < gr; ++t)
      for (int64_t c = 0; c < C; ++c) {
        float v;
        std::memcpy(&v, sb.data() + 4 * (t * ld + c), 4);
        wrong_s += v != 1.0f / want.scale[size_t(t * C + c)];
      }
    EXPECT_EQ(wrong, 0) << "qT codes";
    EXPECT_EQ(wrong_s, 0) << "tile factors";
  }
}

// 128 x 128 (the weights): q[R,C] with s [ceil(R/128)][round4(ceil(C/128))], and qT[C,R]
// with sT [ceil(C/128)][round4(ceil(R/128))]; the health recorded.
TEST_P(Fp8TileCastCuda, BlockTilesAreTheCpuTilesBothWays) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "skipped: " << cuda_unavailable_reason();
  const auto [R, C, shift, path] = GetParam();
  for (const Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    SCOPED_TRACE(f == Fp8Format::E4M3 ? "E4M3" : "E5M2");
    const std::vector<float> x = test_values(R * C, uint32_t(5 * R + 3 * C));
    const Tiles want = cpu_tiles(x, R, C, kFp8Tile, kFp8Tile, f);
    const int64_t gr = (R + kFp8Tile - 1) / kFp8Tile, gc = (C + kFp8Tile - 1) / kFp8Tile;
    const DevX dx(x, R, C, shift);
    const DevRow row(1.0f);
    DevBytes q(R * C, 0), qT(R * C, 0), s(4 * gr * round4(gc), 0), sT(4 * gc * round4(gr), 0);
    cuda::fp8_cast_tiles_blocks(dx.t, row.data(), f, /*record=*/true, q.data(), qT.data(),
                                reinterpret_cast<float*>(s.data()), reinterpret_cast<float*>(sT.data()));
    EXPECT_EQ(q.get(R * C), want.codes);
    const std::vector<uint8_t> got = qT.get(R * C), sb = s.get(4 * gr * round4(gc)), sTb = sT.get(4 * gc * round4(gr));
    int64_t wrong = 0, wrong_s = 0;
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) wrong += got[size_t(c * R + r)] != want.codes[size_t(r * C + c)];
    for (int64_t i = 0; i < gr; ++i)
      for (int64_t j = 0; j < gc; ++j) {
        float a, b;
        std::memcpy(&a, sb.data() + 4 * (i * round4(gc) + j), 4);
        std::memcpy(&b, sTb.data() + 4 * (j * round4(gr) + i), 4);
        wrong_s += (a != 1.0f / want.scale[size_t(i * gc + j)]) + (b != a);
      }
    EXPECT_EQ(wrong, 0) << "qT codes";
    EXPECT_EQ(wrong_s, 0) << "tile factors";
    const std::vector<float> h = row.get();
    EXPECT_EQ(h[kFp8Amax], want.amax);
    EXPECT_EQ(h[kFp8Flushed], float(want.flushed));
    EXPECT_EQ(h[kFp8Nonfinite], float(want.nonfinite));
    EXPECT_EQ(h[kFp8Elements], float(R * C));
  }
}

// 1040 x 4104: 1040 x 33 row tiles, 2,145 blocks' worth of 16, more than the 1,024 the
// vector kernel launches; its column tiles end in a partial 128 x 64 block both ways.
INSTANTIATE_TEST_SUITE_P(Shapes, Fp8TileCastCuda,
                         ::testing::Values(TileCase{1040, 4104, 0, "vector, blocks stride"},
                                           TileCase{272, 136, 0, "vector"}, TileCase{100, 72, 0, "rows vector, cols scalar: R % 16"},
                                           TileCase{144, 13, 0, "scalar: C % 8"}, TileCase{144, 136, 1, "scalar: x misaligned"}));

}  // namespace
}  // namespace lns
#endif  // LNS_WITH_CUDA
