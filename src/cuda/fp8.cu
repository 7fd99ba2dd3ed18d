// The FP8 cast (src/cuda/fp8_cast.h): bf16 -> E4M3/E5M2 with a scale read from the FP8
// table, optionally transposed in the same pass (cuBLASLt's FP8 GEMMs take both
// operands K-major, so the backward needs w, x and dy transposed), and the cast's
// health merged into the table without atomics. CPU reference: lns::cast_to_fp8.
#include "cuda/common.cuh"
#include "cuda/fp8_cast.h"
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

}  // namespace

void fp8_cast(const Tensor& x, float* row, Fp8Format f, bool record, uint8_t* q, uint8_t* qT) {
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
