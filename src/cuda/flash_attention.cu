// Fused causal attention with grouped-query heads on tensor cores, FlashAttention-2
// style: no [T, T] matrix exists in memory. CPU reference: src/cpu/attention.cpp; the
// materialised cuBLASLt path (attention.cu) is the fallback for other head dims.
// docs/cuda.md ("Fused attention") explains the tiling and the determinism scheme.
//
// Layout: q, out, dout, dq [B,T,Hq,D]; k, v, dk, dv [B,T,Hkv,D] (what the
// projections produce: no permutes); lse, delta [B,Hq,T] f32. Query head h reads kv
// head h / G, G = Hq / Hkv. D is 64 or 128 (a template argument).
//
// Forward, one block of 4 warps per (64 query rows, b, h); each warp owns 16 rows.
// K and V stream through shared memory in tiles of 64 keys, only up to the diagonal
// (the masked half is never computed). S = Q K^T and O += P V are mma.sync products
// (mma.cuh); P never leaves registers (the S accumulator becomes the A operand of
// P V). Online softmax in the log2 domain; lse = m + log(l) is saved.
//
// Backward, deterministic, no atomics:
//   delta[b,h,t] = sum_d dO * O                      (flash_delta_kernel)
//   dQ: a block per (64 query rows, b, h) walks the key tiles up to the diagonal and
//       accumulates dQ = scale * dS K in registers  (flash_dq_kernel)
//   dK, dV: a block per (64 keys, b, kv head) walks the G query heads of its group
//       and their query tiles from the diagonal on, accumulating dV = P^T dO and
//       dK = scale * dS^T Q in registers           (flash_dkv_kernel)
// with P = exp(S * scale - lse) recomputed per tile and dS = P * (dP - delta),
// dP = dO V^T. Every sum has one owner thread and a fixed order, so the same inputs
// give the same bits.
#include <algorithm>
#include <cmath>

#include "cuda/common.cuh"
#include "cuda/mma.cuh"
#include "cuda/flash_attention.h"
#include "lns/core/ops.h"
#include "cuda/launch.h"

namespace lns::cuda {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kBr = 16 * kWarps;  // query rows per block (forward, dQ)
constexpr int kBc = 64;           // keys per tile
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// Shared-memory rows are padded by 8 bf16 (16 bytes): rows ld apart start 4 banks
// apart, so the 32-bit fragment loads of a warp (8 rows x 4 words) hit 32 banks.
template <int D>
constexpr int kLd = D + 8;
// dK/dV pass: query rows per tile, smaller at D = 128 to keep the dK and dV
// accumulators (2 x 64 f32 per thread) in registers.
template <int D>
constexpr int kDkvRows = D == 128 ? 32 : 64;

template <int D>
constexpr size_t fwd_smem() { return size_t(kBr + 2 * kBc) * kLd<D> * 2; }
template <int D>
constexpr size_t dq_smem() { return size_t(2 * kBr + 2 * kBc) * kLd<D> * 2; }
template <int D>
constexpr size_t dkv_smem() { return size_t(2 * kBc + 2 * kDkvRows<D>) * kLd<D> * 2 + 2 * kDkvRows<D> * 4; }

// rows [r0, r0 + R) of a [T, *] strided bf16 matrix (row r at g + r * stride) into
// s[R][ld]; rows >= T are zeros (their products are masked, but 0 * NaN is not 0).
// vec: 16-byte loads (g and stride allow them).
template <int D, int R>
__device__ __forceinline__ void load_rows(bf16* s, const bf16* g, int64_t stride, int r0, int T, bool vec) {
  constexpr int ld = kLd<D>, per_row = D / kVec;
  for (int c = threadIdx.x; c < R * per_row; c += kThreads) {
    const int r = c / per_row, d = c % per_row * kVec;
    Bf16x8 x;
    if (r0 + r < T && vec) {
      x = *reinterpret_cast<const Bf16x8*>(g + (r0 + r) * stride + d);
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) x.v[i] = r0 + r < T ? g[(r0 + r) * stride + d + i] : to_bf(0.0f);
    }
    *reinterpret_cast<Bf16x8*>(s + r * ld + d) = x;
  }
}

// max / sum over the 4 lanes that share a row of an accumulator (lanes 4g..4g+3)
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Key tiles a query tile starting at q0 reads: up to the one holding its last row
// (the tiles above the diagonal are skipped), at most all of them.
__device__ __forceinline__ int key_tiles(int T, int q0) {
  const int diagonal = (q0 + kBr - 1) / kBc + 1, all = (T + kBc - 1) / kBc;
  return diagonal < all ? diagonal : all;
}

// Causal tiles are unequal work: the last query tiles see the most keys, so they
// start first (blockIdx.x = 0 takes the last tile).
__device__ __forceinline__ int tile_from_back() { return gridDim.x - 1 - blockIdx.x; }

// What the backward passes recompute from a pair of shared-memory tiles, for this
// warp's 16 rows of `a_*` (already at the warp's first row) against the N rows of
// `b_*` (all [*][kLd<D>] bf16):
//   S = a_s b_s^T, dP = a_dp b_dp^T                         [16][N] each, f32
//   P = exp2(S * sl2 - lse2) where the query sees the key, else 0; dS = P (dP - delta)
// leaving P in s and dS in dp. The dQ pass calls it with (Q, K, dO, V): rows are
// queries; the dK/dV pass with (K, Q, V, dO): rows are keys (the transposed
// products). at(n, i) gives accumulator entry (n, i)'s mask and softmax statistics.
struct RowStats {
  bool visible;  // the query may attend to the key, and both are inside the sequence
  float lse2;    // the query's log-sum-exp, log2 units
  float delta;   // the query's sum_d dO * O
};
template <int D, int N, typename At>
__device__ __forceinline__ void recompute_p_ds(FragC (&s)[N / 8], FragC (&dp)[N / 8], const bf16* a_s,
                                               const bf16* b_s, const bf16* a_dp, const bf16* b_dp, float sl2,
                                               At at) {
  constexpr int ld = kLd<D>;
#pragma unroll
  for (int n = 0; n < N / 8; ++n) {
    s[n] = FragC{{0.0f, 0.0f, 0.0f, 0.0f}};
    dp[n] = FragC{{0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      FragA a;
      FragB bf;
      load_a(a, a_s + kk * 16, ld);
      load_b_nk(bf, b_s + n * 8 * ld + kk * 16, ld);
      mma_16816(s[n], a, bf);
      load_a(a, a_dp + kk * 16, ld);
      load_b_nk(bf, b_dp + n * 8 * ld + kk * 16, ld);
      mma_16816(dp[n], a, bf);
    }
  }
#pragma unroll
  for (int n = 0; n < N / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const RowStats r = at(n, i);
      const float p = r.visible ? exp2f(s[n].r[i] * sl2 - r.lse2) : 0.0f;
      s[n].r[i] = p;
      dp[n].r[i] = p * (dp[n].r[i] - r.delta);
    }
}

// Half-row i (0: row g, 1: row g + 8) of an accumulator row of tiles c[0..N) times
// `mul`, as bf16: tile n's two columns 2t, 2t + 1 go to p[8n + 2t], p[8n + 2t + 1]
// (p: the row's first column). One 4-byte store per tile when the tensor is aligned
// (vec: 16-byte aligned, and D even keeps every 2t column 4-byte aligned), two 2-byte
// stores otherwise.
struct alignas(4) Bf16x2 {
  bf16 v[2];
};
template <int N>
__device__ __forceinline__ void store_c_half(bf16* p, const FragC (&c)[N], int i, float mul, bool vec) {
  p += 2 * (threadIdx.x % 4);
  if (vec) {
#pragma unroll
    for (int n = 0; n < N; ++n)
      *reinterpret_cast<Bf16x2*>(p + n * 8) = Bf16x2{{to_bf(c[n].r[2 * i] * mul), to_bf(c[n].r[2 * i + 1] * mul)}};
  } else {
#pragma unroll
    for (int n = 0; n < N; ++n) {
      p[n * 8] = to_bf(c[n].r[2 * i] * mul);
      p[n * 8 + 1] = to_bf(c[n].r[2 * i + 1] * mul);
    }
  }
}

// ---- forward ----------------------------------------------------------------------
// grid (ceil(T/64), B*Hq), 128 threads, fwd_smem<D>() bytes.
template <int D>
__global__ void flash_fwd_kernel(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int T,
                                 int Hq, int Hkv, float scale, bool vec) {
  LNS_EXTERN_SHARED(Bf16x8, smem);
  constexpr int ld = kLd<D>;
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // [kBr][ld]
  bf16* sK = sQ + kBr * ld;                  // [kBc][ld]
  bf16* sV = sK + kBc * ld;                  // [kBc][ld]
  const int q0 = tile_from_back() * kBr, h = blockIdx.y % Hq, hk = h / (Hq / Hkv);
  const int64_t b = blockIdx.y / Hq;
  const int64_t qs = int64_t(Hq) * D, ks = int64_t(Hkv) * D;  // row strides
  const bf16* qb = q + (b * T * Hq + h) * D;
  const bf16* kb = k + (b * T * Hkv + hk) * D;
  const bf16* vb = v + (b * T * Hkv + hk) * D;
  const int w = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t4 = threadIdx.x % 4;
  const int row[2] = {q0 + w * 16 + g, q0 + w * 16 + g + 8};  // this lane's two rows
  const float sl2 = scale * kLog2e;

  load_rows<D, kBr>(sQ, qb, qs, q0, T, vec);
  __syncthreads();
  FragA qf[D / 16];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) load_a(qf[kk], sQ + w * 16 * ld + kk * 16, ld);

  FragC o[D / 8];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n] = FragC{{0.0f, 0.0f, 0.0f, 0.0f}};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // running max (log2 units), lane-partial sum
  const int tiles = key_tiles(T, q0);
  for (int j = 0; j < tiles; ++j) {
    const int k0 = j * kBc;
    __syncthreads();  // every warp is done with the previous K, V
    load_rows<D, kBc>(sK, kb, ks, k0, T, vec);
    load_rows<D, kBc>(sV, vb, ks, k0, T, vec);
    __syncthreads();
    FragC s[kBc / 8];  // S = Q K^T: [16 rows of this warp][64 keys]
#pragma unroll
    for (int n = 0; n < kBc / 8; ++n) {
      s[n] = FragC{{0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        FragB kf;
        load_b_nk(kf, sK + n * 8 * ld + kk * 16, ld);
        mma_16816(s[n], qf[kk], kf);
      }
    }
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < kBc / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = k0 + n * 8 + 2 * t4 + i % 2, r = row[i / 2];
        const float x = key > r || key >= T ? -INFINITY : s[n].r[i] * sl2;
        s[n].r[i] = x;
        mx[i / 2] = fmaxf(mx[i / 2], x);
      }
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = quad_max(mx[i]);
      // a row with every key so far masked keeps m = -inf; exp2(-inf - 0) = 0 then
      const float base = mx[i] == -INFINITY ? 0.0f : mx[i];
      alpha[i] = exp2f(m[i] - base);
      m[i] = mx[i];
      l[i] *= alpha[i];
    }
#pragma unroll
    for (int n = 0; n < kBc / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float base = m[i / 2] == -INFINITY ? 0.0f : m[i / 2];
        const float p = exp2f(s[n].r[i] - base);
        s[n].r[i] = p;
        l[i / 2] += p;
      }
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[n].r[i] *= alpha[i / 2];
    // O += P V: P (bf16) straight from the S accumulators
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      const FragA pa = a_from_c(s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        FragB vf;
        load_b_kn(vf, sV + kk * 16 * ld + n * 8, ld);
        mma_16816(o[n], pa, vf);
      }
    }
  }
  float inv[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] = quad_sum(l[i]);
    inv[i] = 1.0f / l[i];
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (row[i] >= T) continue;
    bf16* orow = out + ((b * T + row[i]) * Hq + h) * D;
    store_c_half(orow, o, i, inv[i], vec);
    if (t4 == 0) lse[(b * Hq + h) * T + row[i]] = (m[i] + log2f(l[i])) * kLn2;
  }
}

// ---- backward ---------------------------------------------------------------------
// delta[b,h,t] = sum_d dout * out over one [B,T,Hq,D] row: a warp per row, lanes
// strided over d, then the fixed shuffle tree. grid ceil(rows / 4), 128 threads.
__global__ void flash_delta_kernel(float* delta, const bf16* dout, const bf16* out, int64_t rows, int T, int Hq,
                                   int D) {
  const int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;  // [B,T,Hq] row index
  if (r >= rows) return;  // whole warps leave together (rows are warp-uniform)
  float acc = 0.0f;
  for (int d = threadIdx.x % 32; d < D; d += 32) acc += to_f(dout[r * D + d]) * to_f(out[r * D + d]);
  acc = warp_sum(acc);
  const int h = r % Hq;
  const int64_t bt = r / Hq, t = bt % T, b = bt / T;
  if (threadIdx.x % 32 == 0) delta[(b * Hq + h) * T + t] = acc;
}

// dQ: grid (ceil(T/64), B*Hq), 128 threads, dq_smem<D>() bytes.
template <int D>
__global__ void flash_dq_kernel(bf16* dq, const bf16* dout, const float* lse, const float* delta, const bf16* q,
                                const bf16* k, const bf16* v, int T, int Hq, int Hkv, float scale, bool vec) {
  LNS_EXTERN_SHARED(Bf16x8, smem);
  constexpr int ld = kLd<D>;
  bf16* sQ = reinterpret_cast<bf16*>(smem);  // [kBr][ld]
  bf16* sdO = sQ + kBr * ld;                 // [kBr][ld]
  bf16* sK = sdO + kBr * ld;                 // [kBc][ld]
  bf16* sV = sK + kBc * ld;                  // [kBc][ld]
  const int q0 = tile_from_back() * kBr, h = blockIdx.y % Hq, hk = h / (Hq / Hkv);
  const int64_t b = blockIdx.y / Hq;
  const int64_t qs = int64_t(Hq) * D, ks = int64_t(Hkv) * D;
  const bf16* kb = k + (b * T * Hkv + hk) * D;
  const bf16* vb = v + (b * T * Hkv + hk) * D;
  const int w = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t4 = threadIdx.x % 4;
  const int row[2] = {q0 + w * 16 + g, q0 + w * 16 + g + 8};
  const float sl2 = scale * kLog2e;
  float lse2[2], dl[2];  // this lane's rows: lse in log2 units, delta
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const bool in = row[i] < T;
    lse2[i] = in ? lse[(b * Hq + h) * T + row[i]] * kLog2e : 0.0f;
    dl[i] = in ? delta[(b * Hq + h) * T + row[i]] : 0.0f;
  }
  load_rows<D, kBr>(sQ, q + (b * T * Hq + h) * D, qs, q0, T, vec);
  load_rows<D, kBr>(sdO, dout + (b * T * Hq + h) * D, qs, q0, T, vec);

  FragC acc[D / 8];  // dQ / scale: [16 rows][D]
#pragma unroll
  for (int n = 0; n < D / 8; ++n) acc[n] = FragC{{0.0f, 0.0f, 0.0f, 0.0f}};
  const int tiles = key_tiles(T, q0);
  for (int j = 0; j < tiles; ++j) {
    const int k0 = j * kBc;
    __syncthreads();
    load_rows<D, kBc>(sK, kb, ks, k0, T, vec);
    load_rows<D, kBc>(sV, vb, ks, k0, T, vec);
    __syncthreads();
    FragC s[kBc / 8], dp[kBc / 8];  // P, dS: [16 rows][64 keys]
    recompute_p_ds<D, kBc>(s, dp, sQ + w * 16 * ld, sK, sdO + w * 16 * ld, sV, sl2, [&](int n, int i) {
      const int key = k0 + n * 8 + 2 * t4 + i % 2, r = row[i / 2];
      return RowStats{key <= r && key < T, lse2[i / 2], dl[i / 2]};
    });
    // dQ += dS K
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      const FragA da = a_from_c(dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        FragB kf;
        load_b_kn(kf, sK + kk * 16 * ld + n * 8, ld);
        mma_16816(acc[n], da, kf);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (row[i] >= T) continue;
    bf16* drow = dq + ((b * T + row[i]) * Hq + h) * D;
    store_c_half(drow, acc, i, scale, vec);
  }
}

// dK, dV: grid (ceil(T/64), B*Hkv), 128 threads, dkv_smem<D>() bytes. Warp w owns keys
// k0 + 16w .. +15 and works on transposed products (keys x queries).
template <int D>
__global__ void flash_dkv_kernel(bf16* dk, bf16* dv, const bf16* dout, const float* lse, const float* delta,
                                 const bf16* q, const bf16* k, const bf16* v, int T, int Hq, int Hkv, float scale,
                                 bool vec) {
  LNS_EXTERN_SHARED(Bf16x8, smem);
  constexpr int ld = kLd<D>, R = kDkvRows<D>;
  bf16* sK = reinterpret_cast<bf16*>(smem);  // [kBc][ld]
  bf16* sV = sK + kBc * ld;                  // [kBc][ld]
  bf16* sQ = sV + kBc * ld;                  // [R][ld]
  bf16* sdO = sQ + R * ld;                   // [R][ld]
  float* sL = reinterpret_cast<float*>(sdO + R * ld);  // [R] lse (log2 units)
  float* sD = sL + R;                                   // [R] delta
  const int k0 = tile_from_back() * kBc, hk = blockIdx.y % Hkv, G = Hq / Hkv;
  const int64_t b = blockIdx.y / Hkv;
  const int64_t qs = int64_t(Hq) * D, ks = int64_t(Hkv) * D;
  const int w = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t4 = threadIdx.x % 4;
  const int key[2] = {k0 + w * 16 + g, k0 + w * 16 + g + 8};  // this lane's two keys
  const float sl2 = scale * kLog2e;
  load_rows<D, kBc>(sK, k + (b * T * Hkv + hk) * D, ks, k0, T, vec);
  load_rows<D, kBc>(sV, v + (b * T * Hkv + hk) * D, ks, k0, T, vec);

  FragC dka[D / 8], dva[D / 8];  // dK / scale, dV: [16 keys][D]
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    dka[n] = FragC{{0.0f, 0.0f, 0.0f, 0.0f}};
    dva[n] = FragC{{0.0f, 0.0f, 0.0f, 0.0f}};
  }
  const int qtiles = (T + R - 1) / R;
  for (int gi = 0; gi < G; ++gi) {  // the query heads of this kv head, in order
    const int h = hk * G + gi;
    const bf16* qb = q + (b * T * Hq + h) * D;
    const bf16* ob = dout + (b * T * Hq + h) * D;
    for (int qt = k0 / R; qt < qtiles; ++qt) {  // query tiles from the diagonal on
      const int q0 = qt * R;
      __syncthreads();
      load_rows<D, R>(sQ, qb, qs, q0, T, vec);
      load_rows<D, R>(sdO, ob, qs, q0, T, vec);
      for (int i = threadIdx.x; i < R; i += kThreads) {
        const bool in = q0 + i < T;
        sL[i] = in ? lse[(b * Hq + h) * T + q0 + i] * kLog2e : 0.0f;
        sD[i] = in ? delta[(b * Hq + h) * T + q0 + i] : 0.0f;
      }
      __syncthreads();
      FragC s[R / 8], dp[R / 8];  // P^T, dS^T: [16 keys][R queries]
      recompute_p_ds<D, R>(s, dp, sK + w * 16 * ld, sQ, sV + w * 16 * ld, sdO, sl2, [&](int n, int i) {
        const int c = n * 8 + 2 * t4 + i % 2, qi = q0 + c;
        return RowStats{key[i / 2] <= qi && qi < T, sL[c], sD[c]};
      });
      // dV += P^T dO, dK += dS^T Q
#pragma unroll
      for (int kk = 0; kk < R / 16; ++kk) {
        const FragA pa = a_from_c(s[2 * kk], s[2 * kk + 1]);
        const FragA da = a_from_c(dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          FragB bf;
          load_b_kn(bf, sdO + kk * 16 * ld + n * 8, ld);
          mma_16816(dva[n], pa, bf);
          load_b_kn(bf, sQ + kk * 16 * ld + n * 8, ld);
          mma_16816(dka[n], da, bf);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (key[i] >= T) continue;
    const int64_t at = ((b * T + key[i]) * Hkv + hk) * D;
    store_c_half(dk + at, dka, i, scale, vec);
    store_c_half(dv + at, dva, i, 1.0f, vec);
  }
}

struct Shape4 {
  int64_t B;
  int T, Hq, Hkv, D;
};
Shape4 shape_of(const Tensor& q, const Tensor& k) {
  LNS_CHECK(q.shape.ndim == 4 && k.shape.ndim == 4);
  const Shape4 s{q.dim(0), int(q.dim(1)), int(q.dim(2)), int(k.dim(2)), int(q.dim(3))};
  LNS_CHECK(s.Hq % s.Hkv == 0 && k.dim(3) == s.D && k.dim(1) == s.T && k.dim(0) == s.B);
  LNS_CHECK(fused_attention_takes(s.D)) << "fused attention: head dim " << s.D << " (64 or 128)";
  LNS_CHECK(s.B * s.Hq < 65536) << "fused attention: B * Hq = " << s.B * s.Hq << " exceeds grid.y";
  return s;
}
bool aligned16(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (reinterpret_cast<uintptr_t>(t->data) % 16 != 0) return false;
  return true;
}

// Dynamic shared memory above 48 KiB needs the opt-in.
template <typename K>
void allow_smem(K* kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    LNS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

template <int D>
void forward(const Shape4& s, bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, bool vec) {
  allow_smem(flash_fwd_kernel<D>, fwd_smem<D>());  // per call: the attribute is per device
  const dim3 grid(unsigned((s.T + kBr - 1) / kBr), unsigned(s.B * s.Hq));
  LNS_LAUNCH(flash_fwd_kernel<D>, grid, kThreads, fwd_smem<D>(), stream())
  (out, lse, q, k, v, s.T, s.Hq, s.Hkv, 1.0f / std::sqrt(float(D)), vec);
  LNS_CUDA_LAUNCHED();
}

template <int D>
void backward(const Shape4& s, bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const float* lse,
              const float* delta, const bf16* q, const bf16* k, const bf16* v, bool vec) {
  allow_smem(flash_dq_kernel<D>, dq_smem<D>());
  allow_smem(flash_dkv_kernel<D>, dkv_smem<D>());
  const float scale = 1.0f / std::sqrt(float(D));
  const dim3 gq(unsigned((s.T + kBr - 1) / kBr), unsigned(s.B * s.Hq));
  LNS_LAUNCH(flash_dq_kernel<D>, gq, kThreads, dq_smem<D>(), stream())
  (dq, dout, lse, delta, q, k, v, s.T, s.Hq, s.Hkv, scale, vec);
  LNS_CUDA_LAUNCHED();
  const dim3 gkv(unsigned((s.T + kBc - 1) / kBc), unsigned(s.B * s.Hkv));
  LNS_LAUNCH(flash_dkv_kernel<D>, gkv, kThreads, dkv_smem<D>(), stream())
  (dk, dv, dout, lse, delta, q, k, v, s.T, s.Hq, s.Hkv, scale, vec);
  LNS_CUDA_LAUNCHED();
}

}  // namespace

void flash_attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v) {
  for (const Tensor* t : {&out, &q, &k, &v}) expect(*t, DType::BF16, "fused attention");
  expect(lse, DType::F32, "fused attention lse");
  const Shape4 s = shape_of(q, k);
  LNS_CHECK(v.shape == k.shape && out.shape == q.shape && lse.numel() == s.B * s.Hq * s.T);
  if (s.B == 0 || s.T == 0) return;
  const bool vec = aligned16({&out, &q, &k, &v});
  if (s.D == 64)
    forward<64>(s, ptr<bf16>(out), ptr<float>(lse), ptr<bf16>(q), ptr<bf16>(k), ptr<bf16>(v), vec);
  else
    forward<128>(s, ptr<bf16>(out), ptr<float>(lse), ptr<bf16>(q), ptr<bf16>(k), ptr<bf16>(v), vec);
}

void flash_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor lse, Tensor q, Tensor k,
                              Tensor v, Tensor out) {
  for (const Tensor* t : {&dq, &dk, &dv, &dout, &q, &k, &v, &out}) expect(*t, DType::BF16, "fused attention");
  expect(lse, DType::F32, "fused attention lse");
  const Shape4 s = shape_of(q, k);
  LNS_CHECK(v.shape == k.shape && out.shape == q.shape && dout.shape == q.shape && dq.shape == q.shape &&
            dk.shape == k.shape && dv.shape == k.shape && lse.numel() == s.B * s.Hq * s.T);
  if (s.B == 0 || s.T == 0) return;
  const int64_t rows = s.B * s.T * s.Hq;
  float* delta = static_cast<float*>(scratch(Scratch::Attention, size_t(rows) * 4));  // [B,Hq,T]
  LNS_LAUNCH(flash_delta_kernel, unsigned(ceil_div(rows, kWarps)), kThreads, 0, stream())
  (delta, ptr<bf16>(dout), ptr<bf16>(out), rows, s.T, s.Hq, s.D);
  LNS_CUDA_LAUNCHED();
  const bool vec = aligned16({&dq, &dk, &dv, &dout, &q, &k, &v});
  if (s.D == 64)
    backward<64>(s, ptr<bf16>(dq), ptr<bf16>(dk), ptr<bf16>(dv), ptr<bf16>(dout), ptr<float>(lse), delta,
                 ptr<bf16>(q), ptr<bf16>(k), ptr<bf16>(v), vec);
  else
    backward<128>(s, ptr<bf16>(dq), ptr<bf16>(dk), ptr<bf16>(dv), ptr<bf16>(dout), ptr<float>(lse), delta,
                  ptr<bf16>(q), ptr<bf16>(k), ptr<bf16>(v), vec);
}

}  // namespace lns::cuda
