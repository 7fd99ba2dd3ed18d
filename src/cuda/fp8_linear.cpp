// The FP8 linear layer on CUDA (include/lns/core/fp8_linear.h). CPU reference:
// src/cpu/fp8_linear.cpp. cuBLASLt's FP8 matmul takes both operands K-major ("TN"), so
// each product reads the operand layout it needs, cast (and transposed where needed)
// by fp8_cast into one scratch buffer; its scale pointers point at the table's inverse
// scales, so nothing of the table is read back to the host.
//   forward  y[N,out]   = x8[N,in] . w8[out,in]          (K = in)
//   dx       dx[N,in]  (+)= dy8[N,out] . wT8[in,out]     (K = out)
//   dw       dw[out,in] += dyT8[out,N] . xT8[in,N]       (K = N)
// where "A . B" is A @ B^T with both stored K-major. Linears that read one x (q, k, v;
// gate, up) cast it once per direction (the _shared ops). x is cast again in backward
// (not recorded; the same codes as forward's): a step reads it once more instead of
// keeping an 8-bit copy between passes. w is cast once per step by fp8_cast_weight, w8
// and wT8 in one pass, when the stage's FP8 state holds the step's casts (f.w_cast);
// without them (evaluation, tests of the op) each call casts w again, as x.
#include <algorithm>
#include <vector>

#include "cuda/fp8_cast.h"
#include "cuda/fp8_tiles.h"
#include "cuda/gemm.h"
#include "lns/core/fp8_linear.h"
#include "lns/core/ops.h"
#include "cuda/runtime.h"
#include "lns/core/errors.h"

namespace lns::cuda {
namespace {

void expect(const Tensor& t, DType dt, const char* what) {
  LNS_CHECK(t.device == Device::CUDA && t.dtype == dt) << what << ": " << dtype_name(t.dtype) << " on "
                                                       << (t.device == Device::CUDA ? "CUDA" : "the CPU")
                                                       << ", expected CUDA " << dtype_name(dt);
}

// Byte buffers carved from one allocation, each 256-byte aligned (cuBLASLt's preferred
// operand alignment): from the scratch (take) or from a weight's step cast (at).
struct Carve {
  std::vector<int64_t> sizes;
  int64_t total() const {
    int64_t t = 0;
    for (const int64_t n : sizes) t += (n + 255) / 256 * 256;
    return t;
  }
  std::vector<uint8_t*> at(uint8_t* base) const {
    std::vector<uint8_t*> out;
    for (const int64_t n : sizes) out.push_back(base), base += (n + 255) / 256 * 256;
    return out;
  }
  std::vector<uint8_t*> take() const {
    return at(static_cast<uint8_t*>(scratch(Scratch::Fp8Operands, static_cast<size_t>(total()))));
  }
};

// Bytes of an f32 scale tensor, for Carve.
int64_t scale_bytes(GemmScale m, int64_t rows, int64_t K) { return 4 * gemm_scale_floats(m, rows, K); }

// A weight's step cast (f.w_cast, written by fp8_cast_weight): w8[out,in] and
// wT8[in,out] E4M3 codes, then under blockwise their Block128 factors s (out rows, K =
// in) and sT (in rows, K = out).
struct WeightCast {
  uint8_t *w8 = nullptr, *wT8 = nullptr;
  float *s = nullptr, *sT = nullptr;
};
Carve weight_cast_layout(int64_t out, int64_t in, bool blockwise) {
  if (!blockwise) return {{out * in, in * out}};
  return {{out * in, in * out, scale_bytes(GemmScale::Block128, out, in), scale_bytes(GemmScale::Block128, in, out)}};
}
// f.w_cast carved (checked to be the size fp8_weight_cast_numel gives), or all null
// when the linear has no step cast.
WeightCast weight_cast(const Fp8Linear& f, int64_t out, int64_t in) {
  if (f.w_cast.empty()) return {};
  const Carve c = weight_cast_layout(out, in, f.blockwise);
  LNS_CHECK(f.w_cast.device == Device::CUDA && f.w_cast.dtype == DType::F32 && f.w_cast.numel() * 4 == c.total())
      << "fp8 w_cast " << f.w_cast.shape.str() << " for w [" << out << ", " << in << "]";
  const std::vector<uint8_t*> b = c.at(static_cast<uint8_t*>(f.w_cast.data));
  WeightCast w{b[0], b[1]};
  if (f.blockwise) w.s = reinterpret_cast<float*>(b[2]), w.sT = reinterpret_cast<float*>(b[3]);
  return w;
}

GemmArgs fp8_gemm(int64_t M, int64_t N, int64_t K, const uint8_t* a, GemmInput at, const float* a_row,
                  const uint8_t* b, GemmInput bt, const float* b_row) {
  GemmArgs g;
  g.M = M, g.N = N, g.K = K;
  g.A = a, g.lda = K, g.a_type = at, g.a_scale = a_row + kFp8ScaleInv;
  g.B = b, g.ldb = K, g.trans_b = true, g.b_type = bt, g.b_scale = b_row + kFp8ScaleInv;
  return g;
}

// --fp8=blockwise: the same three products on tile-scaled operands (fp8_cast_tiles_*),
// their factors read by cuBLASLt's block scale modes (1 x 128: Vec128, 128 x 128: Block128):
//   forward  y  = x8[N,in] (1x128) . w8[out,in] (128x128)
//   dx       dx (+)= dy8[N,out] (1x128) . wT8[in,out] (128x128, the transposed grid)
//   dw       dw += dyT8[out,N] (128x1 of dy) . xT8[in,N] (128x1 of x)
GemmArgs tiled_gemm(int64_t M, int64_t N, int64_t K, const uint8_t* a, GemmInput at, const float* sa, GemmScale ma,
                    const uint8_t* b, GemmInput bt, const float* sb, GemmScale mb) {
  GemmArgs g;
  g.M = M, g.N = N, g.K = K;
  g.A = a, g.lda = K, g.a_type = at, g.a_scale = sa, g.a_scale_mode = ma;
  g.B = b, g.ldb = K, g.trans_b = true, g.b_type = bt, g.b_scale = sb, g.b_scale_mode = mb;
  return g;
}


// The largest of f(i) over the linears that need it (need(i)), 0 if none: a scratch
// buffer that the linears use one after another (their casts and GEMMs are queued in
// order on one stream).
template <class F, class N>
int64_t largest(size_t n, N need, F f) {
  int64_t m = 0;
  for (size_t i = 0; i < n; ++i)
    if (need(i)) m = std::max(m, f(i));
  return m;
}

}  // namespace

// x8[N,in] once (recorded in the group's x row), then per linear w8 (the step cast, or
// cast here into one buffer the linears take in turn) and y = x8 . w8.
void linear_forward_fp8_shared(const std::vector<Tensor>& ys, Tensor x, const std::vector<Tensor>& ws,
                               const std::vector<Fp8Linear>& fs) {
  check_fp8_shared(ys.size(), ws.size(), fs);
  expect(x, DType::BF16, "fp8 linear x");
  expect(fs[0].table, DType::F32, "fp8 table");
  const int64_t in = x.dim(-1), rows = x.numel() / in;
  const size_t n = ws.size();
  for (size_t i = 0; i < n; ++i) {
    expect(ws[i], DType::BF16, "fp8 linear w");
    LNS_CHECK(ws[i].dim(1) == in && ys[i].numel() == rows * ws[i].dim(0));
  }
  const bool bw = fs[0].blockwise;
  const auto uncached = [&](size_t i) { return fs[i].w_cast.empty(); };
  const std::vector<uint8_t*> buf =
      Carve{{rows * in, bw ? scale_bytes(GemmScale::Vec128, rows, in) : 0,
             largest(n, uncached, [&](size_t i) { return ws[i].dim(0) * in; }),
             bw ? largest(n, uncached, [&](size_t i) { return scale_bytes(GemmScale::Block128, ws[i].dim(0), in); })
                : 0}}
          .take();
  float* rx = fs[0].row(fs[0].x);
  auto* sx = reinterpret_cast<float*>(buf[1]);
  if (bw)
    fp8_cast_tiles_rows(x.view({rows, in}), rx, Fp8Format::E4M3, true, buf[0], sx);  // 1 x 128 along in
  else
    fp8_cast(x.view({rows, in}), rx, Fp8Format::E4M3, true, buf[0], nullptr);
  for (size_t i = 0; i < n; ++i) {
    const Fp8Linear& f = fs[i];
    const int64_t out = ws[i].dim(0);
    float* rw = f.row(f.w);
    WeightCast wc = weight_cast(f, out, in);  // w8[out,in]
    if (!wc.w8) {
      wc.w8 = buf[2], wc.s = reinterpret_cast<float*>(buf[3]);
      if (bw)
        fp8_cast_tiles_blocks(ws[i], rw, Fp8Format::E4M3, true, wc.w8, nullptr, wc.s, nullptr);
      else
        fp8_cast(ws[i], rw, Fp8Format::E4M3, true, wc.w8, nullptr);
    }
    GemmArgs g = bw ? tiled_gemm(rows, out, in, buf[0], GemmInput::E4M3, sx, GemmScale::Vec128, wc.w8,
                                 GemmInput::E4M3, wc.s, GemmScale::Block128)
                    : fp8_gemm(rows, out, in, buf[0], GemmInput::E4M3, rx, wc.w8, GemmInput::E4M3, rw);
    g.C = ys[i].data, g.ldc = out, g.c_dtype = ys[i].dtype;
    gemm(g);
  }
}

// xT8[in,N] once (not recorded), then per linear: dy8 and dyT8 (recorded in its dy
// row), dx (+)= dy8 . wT8 and dw += dyT8 . xT8.
void linear_backward_fp8_shared(Tensor dx, const std::vector<Tensor>& dws, const std::vector<Tensor>& dys, Tensor x,
                                const std::vector<Tensor>& ws, bool accumulate_dx, const std::vector<Fp8Linear>& fs) {
  check_fp8_shared(dws.size(), ws.size(), fs);
  LNS_CHECK(dys.size() == ws.size());
  expect(x, DType::BF16, "fp8 linear x");
  expect(fs[0].table, DType::F32, "fp8 table");
  const int64_t in = x.dim(-1), rows = x.numel() / in;
  LNS_CHECK(dx.empty() || dx.numel() == rows * in);
  const size_t n = ws.size();
  for (size_t i = 0; i < n; ++i) {
    expect(dys[i], DType::BF16, "fp8 linear dy");
    expect(ws[i], DType::BF16, "fp8 linear w");
    expect(dws[i], DType::F32, "fp8 linear dw");
    LNS_CHECK(ws[i].dim(1) == in && dys[i].numel() == rows * ws[i].dim(0) && dws[i].numel() == ws[i].numel());
  }
  const bool bw = fs[0].blockwise;
  const auto all = [](size_t) { return true; };
  const auto cast_wT = [&](size_t i) { return fs[i].w_cast.empty() && !dx.empty(); };
  const int64_t max_out = largest(n, all, [&](size_t i) { return ws[i].dim(0); });
  const std::vector<uint8_t*> buf =
      Carve{{rows * max_out, max_out * rows, largest(n, cast_wT, [&](size_t i) { return in * ws[i].dim(0); }),
             in * rows, bw ? scale_bytes(GemmScale::Vec128, rows, max_out) : 0,
             bw ? scale_bytes(GemmScale::Vec128, max_out, rows) : 0,
             bw ? largest(n, cast_wT, [&](size_t i) { return scale_bytes(GemmScale::Block128, in, ws[i].dim(0)); }) : 0,
             bw ? scale_bytes(GemmScale::Vec128, in, rows) : 0}}
          .take();
  uint8_t *dy8 = buf[0], *dyT8 = buf[1], *xT8 = buf[3];
  auto sc = [&](int i) { return reinterpret_cast<float*>(buf[size_t(i)]); };
  float* rx = fs[0].row(fs[0].x);
  if (bw)
    fp8_cast_tiles_cols(x.view({rows, in}), Fp8Format::E4M3, xT8, sc(7));  // 128 x 1 down N
  else
    fp8_cast(x.view({rows, in}), rx, Fp8Format::E4M3, false, nullptr, xT8);
  for (size_t i = 0; i < n; ++i) {
    const Fp8Linear& f = fs[i];
    const int64_t out = ws[i].dim(0);
    float *rw = f.row(f.w), *rdy = f.row(f.dy);
    const Tensor dy = dys[i].view({rows, out});
    if (bw)
      fp8_cast_tiles_rows(dy, rdy, Fp8Format::E5M2, true, dy8, sc(4));  // 1 x 128 along out
    else
      fp8_cast(dy, rdy, Fp8Format::E5M2, true, dx.empty() ? nullptr : dy8, dyT8);
    if (!dx.empty()) {
      WeightCast wc = weight_cast(f, out, in);  // wT8[in,out]
      if (!wc.wT8) {
        wc.wT8 = buf[2], wc.sT = sc(6);
        if (bw)
          fp8_cast_tiles_blocks(ws[i], rw, Fp8Format::E4M3, false, nullptr, wc.wT8, nullptr, wc.sT);
        else
          fp8_cast(ws[i], rw, Fp8Format::E4M3, false, nullptr, wc.wT8);
      }
      GemmArgs g = bw ? tiled_gemm(rows, in, out, dy8, GemmInput::E5M2, sc(4), GemmScale::Vec128, wc.wT8,
                                   GemmInput::E4M3, wc.sT, GemmScale::Block128)
                      : fp8_gemm(rows, in, out, dy8, GemmInput::E5M2, rdy, wc.wT8, GemmInput::E4M3, rw);
      g.C = dx.data, g.ldc = in, g.c_dtype = dx.dtype, g.beta = i > 0 || accumulate_dx ? 1.0f : 0.0f;
      gemm(g);
    }
    if (bw) fp8_cast_tiles_cols(dy, Fp8Format::E5M2, dyT8, sc(5));  // 128 x 1 down N
    GemmArgs g = bw ? tiled_gemm(out, in, rows, dyT8, GemmInput::E5M2, sc(5), GemmScale::Vec128, xT8, GemmInput::E4M3,
                                 sc(7), GemmScale::Vec128)
                    : fp8_gemm(out, in, rows, dyT8, GemmInput::E5M2, rdy, xT8, GemmInput::E4M3, rx);
    g.C = dws[i].data, g.ldc = in, g.c_dtype = DType::F32, g.beta = 1.0f;
    gemm(g);
  }
}

int64_t fp8_weight_cast_numel(Tensor w, const Fp8Linear& f) {
  LNS_CHECK(w.shape.ndim == 2) << "fp8 weight " << w.shape.str();
  return weight_cast_layout(w.dim(0), w.dim(1), f.blockwise).total() / 4;  // 256-byte multiples
}

// w8 and wT8 (and under blockwise their factors) in one pass over w, recorded.
void fp8_cast_weight(Tensor w_cast, Tensor w, const Fp8Linear& f) {
  expect(w, DType::BF16, "fp8 weight");
  expect(f.table, DType::F32, "fp8 table");
  Fp8Linear g = f;
  g.w_cast = w_cast;
  const WeightCast c = weight_cast(g, w.dim(0), w.dim(1));
  LNS_CHECK(c.w8 != nullptr) << "fp8_cast_weight: no w_cast";
  if (f.blockwise) return fp8_cast_tiles_blocks(w, f.row(f.w), Fp8Format::E4M3, true, c.w8, c.wT8, c.s, c.sT);
  fp8_cast(w, f.row(f.w), Fp8Format::E4M3, true, c.w8, c.wT8);
}

// This file's ops on CUDA (lns/core/op_table.h).
LNS_REGISTER_OPS(Device::CUDA) {
  LNS_REGISTER_OP(linear_forward_fp8_shared, cuda::linear_forward_fp8_shared);
  LNS_REGISTER_OP(linear_backward_fp8_shared, cuda::linear_backward_fp8_shared);
  LNS_REGISTER_OP(fp8_weight_cast_numel, cuda::fp8_weight_cast_numel);
  LNS_REGISTER_OP(fp8_cast_weight, cuda::fp8_cast_weight);
}

}  // namespace lns::cuda
