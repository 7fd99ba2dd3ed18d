// The FP8 linear layer on the CPU (include/lns/core/fp8_linear.h): the reference the CUDA
// path and its cuBLASLt stand-in are held to. Each operand is cast to its 8-bit codes
// with lns/core/fp8_format.h's cast (the one definition of rounding and saturation), decoded back
// to the exact f32 values those codes stand for, multiplied by OpenBLAS in f32 and
// unscaled in the GEMM's alpha = (1/sa)(1/sb) (the table's inverses), as cuBLASLt's
// epilogue applies its A and B scale pointers.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "cpu/check.h"
#include "lns/core/fp8_format.h"
#include "lns/core/fp8_linear.h"
#include "lns/core/fp8_recipe.h"

namespace lns {
namespace {

// The f32 value of every code of a format (exact: 8-bit floats are f32 values).
const std::array<float, 256>& decode_table(Fp8Format fmt) {
  static const auto make = [](Fp8Format f) {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = fp8_to_f32(static_cast<uint8_t>(c), f);
    return t;
  };
  static const std::array<float, 256> e4m3 = make(Fp8Format::E4M3), e5m2 = make(Fp8Format::E5M2);
  return fmt == Fp8Format::E4M3 ? e4m3 : e5m2;
}

// A cast's health, from its chunks' stats, into its table row (amax as a max, counts as sums).
void add_health(float* row, const std::vector<Fp8CastStats>& st, int64_t elements) {
  for (const Fp8CastStats& s : st) {
    row[kFp8Amax] = std::max(row[kFp8Amax], s.amax);
    row[kFp8Saturated] += static_cast<float>(s.saturated);
    row[kFp8Flushed] += static_cast<float>(s.flushed);
    row[kFp8Nonfinite] += static_cast<float>(s.nonfinite);
  }
  row[kFp8Elements] += static_cast<float>(elements);
}

// q[i] = the value of Q(t[i] * scale) (not unscaled: the GEMM's alpha does that), into
// q[t.numel()] (every element written). Adds the cast's health to `row` when record.
void quantize_into(float* q, const Tensor& t, float* row, Fp8Format fmt, bool record) {
  const int64_t n = t.numel();
  const float scale = row[kFp8Scale];
  LNS_CHECK(scale > 0.0f) << "fp8: scale " << scale << " is not positive";
  constexpr int64_t kChunk = 1 << 13;  // small enough that every thread gets a share of a layer's x
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<Fp8CastStats> st(static_cast<size_t>(chunks));
  const std::array<float, 256>& dec = decode_table(fmt);
  const float* x = t.f32();
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = c * kChunk, e = std::min(n, b + kChunk);
    uint8_t codes[kChunk];
    st[static_cast<size_t>(c)] = cast_to_fp8(x + b, e - b, scale, fmt, codes);
    for (int64_t i = b; i < e; ++i) q[i] = dec[codes[i - b]];
  }
  if (record) add_health(row, st, n);
}

std::unique_ptr<float[]> quantize(const Tensor& t, float* row, Fp8Format fmt, bool record) {
  std::unique_ptr<float[]> q(new float[static_cast<size_t>(t.numel())]);
  quantize_into(q.get(), t, row, fmt, record);
  return q;
}

// --fp8=blockwise: t[R,C] cast tile by tile (tiles of tr x tc values, the edges cut
// short), each with its own power-of-two scale (fp8_pow2_scale), and returned unscaled:
// q[i] = value(code_i) / s_tile, exact, into q[R*C]. Adds the cast's health to `row` when record.
void quantize_tiles_into(float* q, const Tensor& t, int64_t R, int64_t C, int64_t tr, int64_t tc, float* row,
                         Fp8Format fmt, bool record) {
  LNS_CHECK(t.numel() == R * C && tr > 0 && tc > 0);
  const float* x = t.f32();
  const std::array<float, 256>& dec = decode_table(fmt);
  const int64_t row_tiles = (R + tr - 1) / tr, col_tiles = (C + tc - 1) / tc;
  std::vector<Fp8CastStats> st(static_cast<size_t>(row_tiles));
  const float limit = fp8_max(fmt);
#pragma omp parallel for schedule(static)
  for (int64_t bi = 0; bi < row_tiles; ++bi) {
    const int64_t r0 = bi * tr, r1 = std::min(R, r0 + tr);
    std::vector<float> amax(static_cast<size_t>(col_tiles), 0.0f), scale(amax.size());
    Fp8CastStats& s = st[static_cast<size_t>(bi)];
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < col_tiles; ++j) {
        float m = amax[static_cast<size_t>(j)];
        for (int64_t c = j * tc; c < std::min(C, (j + 1) * tc); ++c) {
          const float a = std::fabs(x[r * C + c]);
          if (a <= std::numeric_limits<float>::max()) {
            m = std::max(m, a);
          } else {
            ++s.nonfinite;
          }
        }
        amax[static_cast<size_t>(j)] = m;
      }
    for (size_t j = 0; j < amax.size(); ++j) {
      scale[j] = fp8_pow2_scale(amax[j], fmt);
      s.amax = std::max(s.amax, amax[j]);
    }
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < col_tiles; ++j) {
        const float sc = scale[static_cast<size_t>(j)], inv = 1.0f / sc;  // powers of two: exact
        for (int64_t c = j * tc; c < std::min(C, (j + 1) * tc); ++c) {
          const float v = x[r * C + c] * sc, av = std::fabs(v);
          const uint8_t code = fp8_encode_satfinite(v, fmt);
          q[r * C + c] = dec[code] * inv;
          s.saturated += av > limit && av <= std::numeric_limits<float>::max();
          s.flushed += av > 0.0f && av <= std::numeric_limits<float>::max() && (code & 0x7F) == 0;
        }
      }
  }
  if (record) add_health(row, st, R * C);
}

std::unique_ptr<float[]> quantize_tiles(const Tensor& t, int64_t R, int64_t C, int64_t tr, int64_t tc, float* row,
                                        Fp8Format fmt, bool record) {
  std::unique_ptr<float[]> q(new float[static_cast<size_t>(R * C)]);
  quantize_tiles_into(q.get(), t, R, C, tr, tc, row, fmt, record);
  return q;
}

// w[out,in] as the GEMMs read it (E4M3; 128 x 128 tiles under blockwise, which read the
// same in both directions), into q[out*in].
void quantize_weight_into(float* q, const Tensor& w, const Fp8Linear& f, bool record) {
  if (f.blockwise)
    return quantize_tiles_into(q, w, w.dim(0), w.dim(1), kFp8Tile, kFp8Tile, f.row(f.w), Fp8Format::E4M3, record);
  quantize_into(q, w, f.row(f.w), Fp8Format::E4M3, record);
}

// w's operand: the step's cast (f.w_cast, from fp8_cast_weight) or one made here into
// `own` (recorded when `record`: the forward's; the backward's repeats it).
const float* weight_operand(std::unique_ptr<float[]>& own, const Tensor& w, const Fp8Linear& f, bool record) {
  if (!f.w_cast.empty()) {
    LNS_CHECK(f.w_cast.dtype == DType::F32 && f.w_cast.numel() == w.numel())
        << "fp8 w_cast " << f.w_cast.shape.str() << " for w " << w.shape.str();
    return f.w_cast.f32();
  }
  own.reset(new float[static_cast<size_t>(w.numel())]);
  quantize_weight_into(own.get(), w, f, record);
  return own.get();
}

}  // namespace

namespace cpu {

int64_t fp8_weight_cast_numel(Tensor w, const Fp8Linear& f) {
  return w.numel();
}

void fp8_cast_weight(Tensor w_cast, Tensor w, const Fp8Linear& f) {
  cpu::require_cpu({&w_cast, &w, &f.table});
  LNS_CHECK(w.shape.ndim == 2 && w.dtype == DType::F32 && w_cast.dtype == DType::F32 && w_cast.numel() == w.numel())
      << "fp8_cast_weight: w " << w.shape.str() << " into " << w_cast.shape.str();
  quantize_weight_into(w_cast.f32(), w, f, /*record=*/true);
}

void linear_forward_fp8_shared(const std::vector<Tensor>& ys, Tensor x, const std::vector<Tensor>& ws,
                               const std::vector<Fp8Linear>& fs) {
  cpu::require_cpu({&x, &fs[0].table});
  LNS_CHECK(x.dtype == DType::F32) << "linear_fp8: x " << dtype_name(x.dtype);
  const int64_t N = cpu::rows_of(x), in = cpu::cols_of(x);
  const bool blockwise = fs[0].blockwise;
  float* rx = fs[0].row(fs[0].x);
  // qx[N,in]: one cast for every linear (1 x 128 tiles along in, already unscaled, or
  // the per-tensor scale that each GEMM's alpha undoes)
  const std::unique_ptr<float[]> qx = blockwise ? quantize_tiles(x, N, in, 1, kFp8Tile, rx, Fp8Format::E4M3, true)
                                                : quantize(x, rx, Fp8Format::E4M3, true);
  for (size_t i = 0; i < ws.size(); ++i) {
    const Tensor &y = ys[i], &w = ws[i];
    const Fp8Linear& f = fs[i];
    cpu::require_cpu({&y, &w});
    const int64_t out = w.dim(0);
    LNS_CHECK(w.dim(1) == in && y.numel() == N * out)
        << "linear_fp8: x " << x.shape.str() << " w " << w.shape.str() << " y " << y.shape.str();
    std::unique_ptr<float[]> own;
    const float* qw = weight_operand(own, w, f, true);  // [out,in]
    if (N == 0) continue;
    // y[N,out] = qx[N,in] @ qw[out,in]^T (/ (sx sw))
    const float alpha = blockwise ? 1.0f : rx[kFp8ScaleInv] * f.row(f.w)[kFp8ScaleInv];
    cpu::gemm_rows(CblasNoTrans, CblasTrans, N, out, in, alpha, qx.get(), in, qw, in, 0.0f, y.f32(), out);
  }
}

void linear_backward_fp8_shared(Tensor dx, const std::vector<Tensor>& dws, const std::vector<Tensor>& dys, Tensor x,
                                const std::vector<Tensor>& ws, bool accumulate_dx, const std::vector<Fp8Linear>& fs) {
  cpu::require_cpu({&dx, &x, &fs[0].table});
  const int64_t N = cpu::rows_of(x), in = cpu::cols_of(x);
  LNS_CHECK(dx.empty() || dx.numel() == N * in) << "linear_fp8: dx " << dx.shape.str() << " x " << x.shape.str();
  const bool blockwise = fs[0].blockwise;
  float* rx = fs[0].row(fs[0].x);
  // x for the weight gradients, whose K is N: once for every linear, not recorded (the
  // forward's cast has its health). Blockwise: 128 x 1 tiles down N.
  const std::unique_ptr<float[]> qx = blockwise ? quantize_tiles(x, N, in, kFp8Tile, 1, rx, Fp8Format::E4M3, false)
                                                : quantize(x, rx, Fp8Format::E4M3, false);
  for (size_t i = 0; i < ws.size(); ++i) {
    const Tensor &dy = dys[i], &dw = dws[i], &w = ws[i];
    const Fp8Linear& f = fs[i];
    cpu::require_cpu({&dy, &dw, &w});
    const int64_t out = w.dim(0);
    LNS_CHECK(dy.numel() == N * out && dw.numel() == out * in);
    float* rdy = f.row(f.dy);
    // dy for dx, K = out (blockwise: 1 x 128 tiles along out); recorded
    const std::unique_ptr<float[]> qdy = blockwise ? quantize_tiles(dy, N, out, 1, kFp8Tile, rdy, Fp8Format::E5M2, true)
                                                   : quantize(dy, rdy, Fp8Format::E5M2, true);
    if (N == 0) continue;
    if (!dx.empty()) {
      std::unique_ptr<float[]> own;
      const float* qw = weight_operand(own, w, f, false);
      // dx[N,in] (+)= qdy[N,out] @ qw[out,in] (/ (sdy sw))
      const float alpha = blockwise ? 1.0f : rdy[kFp8ScaleInv] * f.row(f.w)[kFp8ScaleInv];
      cpu::gemm_rows(CblasNoTrans, CblasNoTrans, N, in, out, alpha, qdy.get(), out, qw, in,
                     i > 0 || accumulate_dx ? 1.0f : 0.0f, dx.f32(), in);
    }
    // dw[out,in] += qdy^T[out,N] @ qx[N,in] (/ (sdy sx)); blockwise casts dy again in
    // 128 x 1 tiles down N (not recorded)
    if (blockwise) {
      const std::unique_ptr<float[]> cdy = quantize_tiles(dy, N, out, kFp8Tile, 1, rdy, Fp8Format::E5M2, false);
      cpu::gemm_rows(CblasTrans, CblasNoTrans, out, in, N, 1.0f, cdy.get(), out, qx.get(), in, 1.0f, dw.f32(), in);
    } else {
      cpu::gemm_rows(CblasTrans, CblasNoTrans, out, in, N, rdy[kFp8ScaleInv] * rx[kFp8ScaleInv], qdy.get(), out,
                     qx.get(), in, 1.0f, dw.f32(), in);
    }
  }
}

}  // namespace cpu

LNS_REGISTER_OPS(Device::CPU) {
  LNS_REGISTER_OP(fp8_weight_cast_numel, cpu::fp8_weight_cast_numel);
  LNS_REGISTER_OP(fp8_cast_weight, cpu::fp8_cast_weight);
  LNS_REGISTER_OP(linear_forward_fp8_shared, cpu::linear_forward_fp8_shared);
  LNS_REGISTER_OP(linear_backward_fp8_shared, cpu::linear_backward_fp8_shared);
}

}  // namespace lns
