// RMSNorm / LayerNorm with gain, optional bias and the LNS output scale.
// Statistics accumulate in double: deterministic, and closer to the f64 reference.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/check.h"
#include "lns/core/ops.h"

namespace lns {
namespace {

// One row: fills mean (LayerNorm) and rstd, writes out[c] = scale*(xhat*g + b).
// fixed_rstd > 0: the divisor is that constant's inverse instead of the measured one
// (LN-free fine-tuning); the mean is still measured and subtracted for LayerNorm.
inline void norm_row(NormType type, float* out, float* mean_out, float* rstd_out, const float* x,
                     const float* g, const float* b, float scale, float eps, int64_t C,
                     float fixed_rstd = 0.0f) {
  double mean = 0.0;
  if (type == NormType::LayerNorm) {
    for (int64_t c = 0; c < C; ++c) mean += x[c];
    mean /= C;
  }
  float rstd = fixed_rstd;
  if (fixed_rstd <= 0.0f) {
    double var = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      const double d = x[c] - mean;
      var += d * d;
    }
    var /= C;
    rstd = static_cast<float>(1.0 / std::sqrt(var + eps));
  }
  const float m = static_cast<float>(mean);
  for (int64_t c = 0; c < C; ++c) {
    const float xhat = (x[c] - m) * rstd;
    out[c] = scale * (xhat * g[c] + (b ? b[c] : 0.0f));
  }
  if (mean_out) *mean_out = m;
  *rstd_out = rstd;
}

void check_norm_args(NormType type, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                     const Tensor& x, const Tensor& gain, const Tensor& bias) {
  cpu::require_cpu({&out, &mean, &rstd, &x, &gain, &bias});
  const int64_t N = cpu::rows_of(x), C = cpu::cols_of(x);
  LNS_CHECK(out.numel() == N * C && gain.numel() == C && rstd.numel() == N);
  if (type == NormType::LayerNorm) {
    LNS_CHECK(mean.numel() == N && bias.numel() == C) << "LayerNorm needs mean and bias";
  } else {
    LNS_CHECK(bias.empty()) << "RMSNorm has no bias";
  }
}

}  // namespace

namespace cpu {

void norm_forward(NormType type, Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor gain,
                  Tensor bias, float scale, float eps) {
  check_norm_args(type, out, mean, rstd, x, gain, bias);
  const int64_t N = cpu::rows_of(x), C = cpu::cols_of(x);
  const float* b = bias.empty() ? nullptr : bias.f32();
  float* mp = mean.empty() ? nullptr : mean.f32();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    norm_row(type, out.f32() + n * C, mp ? mp + n : nullptr, rstd.f32() + n, x.f32() + n * C,
             gain.f32(), b, scale, eps, C);
}

void residual_norm_forward(NormType type, Tensor res_out, Tensor out, Tensor mean, Tensor rstd,
                           Tensor res_in, Tensor delta, float alpha, Tensor gain, Tensor bias,
                           float scale, float eps) {
  check_norm_args(type, out, mean, rstd, res_in, gain, bias);
  LNS_CHECK(res_out.numel() == res_in.numel() && delta.numel() == res_in.numel());
  const int64_t N = cpu::rows_of(res_in), C = cpu::cols_of(res_in);
  const float* b = bias.empty() ? nullptr : bias.f32();
  float* mp = mean.empty() ? nullptr : mean.f32();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* r = res_out.f32() + n * C;
    const float* ri = res_in.f32() + n * C;
    const float* d = delta.f32() + n * C;
    for (int64_t c = 0; c < C; ++c) r[c] = alpha * ri[c] + d[c];
    norm_row(type, out.f32() + n * C, mp ? mp + n : nullptr, rstd.f32() + n, r, gain.f32(), b,
             scale, eps, C);
  }
}

namespace {

// fixed: rstd is a constant (not a function of x), so the term through the divisor
// (-xhat * mean(dxhat*xhat)) vanishes; LayerNorm's mean term stays.
void norm_backward_cpu(NormType type, Tensor dx, Tensor dgain, Tensor dbias, Tensor dres,
                       Tensor dout, Tensor x, Tensor mean, Tensor rstd, Tensor gain, float scale,
                       bool fixed) {
  cpu::require_cpu({&dx, &dgain, &dbias, &dres, &dout, &x, &mean, &rstd, &gain});
  const int64_t N = cpu::rows_of(x), C = cpu::cols_of(x);
  LNS_CHECK(dx.numel() == N * C && dout.numel() == N * C && dgain.numel() == C);
  LNS_CHECK(dres.empty() || dres.numel() == N * C);
  const bool ln = type == NormType::LayerNorm;
  const float* g = gain.f32();
  // dgain/dbias: per-block partials over fixed blocks of kRowsPerBlock rows, summed in
  // block order, so the result does not depend on the number of threads.
  constexpr int64_t kRowsPerBlock = 32;
  const int64_t num_blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  // The calling thread's buffers, grown once and reused; the OpenMP workers write
  // into them through these pointers (their own thread_locals would be empty).
  thread_local std::vector<float> part_g_buf, part_b_buf;
  part_g_buf.assign(num_blocks * C, 0.0f);
  part_b_buf.assign(dbias.empty() ? 0 : num_blocks * C, 0.0f);
  float* const part_g = part_g_buf.data();
  float* const part_b = dbias.empty() ? nullptr : part_b_buf.data();
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    float* pg = part_g + blk * C;
    float* pb = part_b ? part_b + blk * C : nullptr;
    for (int64_t n = blk * kRowsPerBlock; n < std::min(N, (blk + 1) * kRowsPerBlock); ++n) {
      const float* xr = x.f32() + n * C;
      const float* dy = dout.f32() + n * C;
      const float m = ln ? mean.f32()[n] : 0.0f;
      const float rs = rstd.f32()[n];
      // dxhat = scale * g * dy ; dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat*xhat))
      double sum_dxhat = 0.0, sum_dxhat_xhat = 0.0;
      for (int64_t c = 0; c < C; ++c) {
        const float xhat = (xr[c] - m) * rs;
        const float dxhat = scale * g[c] * dy[c];
        sum_dxhat += dxhat;
        sum_dxhat_xhat += static_cast<double>(dxhat) * xhat;
        pg[c] += scale * dy[c] * xhat;
        if (pb) pb[c] += scale * dy[c];
      }
      const float mean_dxhat = ln ? static_cast<float>(sum_dxhat / C) : 0.0f;
      const float mean_dxhat_xhat = fixed ? 0.0f : static_cast<float>(sum_dxhat_xhat / C);
      float* dxr = dx.f32() + n * C;
      const float* dr = dres.empty() ? nullptr : dres.f32() + n * C;
      for (int64_t c = 0; c < C; ++c) {
        const float xhat = (xr[c] - m) * rs;
        const float dxhat = scale * g[c] * dy[c];
        const float v = rs * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
        dxr[c] = (dr ? dr[c] : 0.0f) + v;
      }
    }
  }
  float* dg = dgain.f32();
  float* db = dbias.empty() ? nullptr : dbias.f32();
  for (int64_t blk = 0; blk < num_blocks; ++blk)
    for (int64_t c = 0; c < C; ++c) {
      dg[c] += part_g[blk * C + c];
      if (db) db[c] += part_b[blk * C + c];
    }
}

}  // namespace

void norm_backward(NormType type, Tensor dx, Tensor dgain, Tensor dbias, Tensor dres, Tensor dout,
                   Tensor x, Tensor mean, Tensor rstd, Tensor gain, float scale) {
  norm_backward_cpu(type, dx, dgain, dbias, dres, dout, x, mean, rstd, gain, scale, false);
}

void norm_forward_fixed(NormType type, Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor gain,
                        Tensor bias, float scale, FixedDivisor d) {
  check_norm_args(type, out, mean, rstd, x, gain, bias);
  const int64_t N = cpu::rows_of(x), C = cpu::cols_of(x);
  const float* b = bias.empty() ? nullptr : bias.f32();
  float* mp = mean.empty() ? nullptr : mean.f32();
  if (d.eot >= 0) {
    cpu::require_cpu({&d.ids});
    LNS_CHECK(d.ids.dtype == DType::I32 && d.ids.numel() == N) << "end-of-text case needs ids [N] i32";
  }
  const float r0 = 1.0f / d.pos0, r = 1.0f / d.rest;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    norm_row(type, out.f32() + n * C, mp ? mp + n : nullptr, rstd.f32() + n, x.f32() + n * C,
             gain.f32(), b, scale, 0.0f, C, d.uses_pos0(n) ? r0 : r);
}

void norm_backward_fixed(NormType type, Tensor dx, Tensor dgain, Tensor dbias, Tensor dres,
                         Tensor dout, Tensor x, Tensor mean, Tensor rstd, Tensor gain, float scale) {
  norm_backward_cpu(type, dx, dgain, dbias, dres, dout, x, mean, rstd, gain, scale, true);
}

void norm_divisor_sums(NormType type, Tensor x, int64_t T, float eps, double sums[4], int64_t row0) {
  cpu::require_cpu({&x});
  const int64_t N = cpu::rows_of(x), C = cpu::cols_of(x);
  // Serial, in row order: the sums (and so the calibrated constants) are deterministic.
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x.f32() + n * C;
    double mean = 0.0, var = 0.0;
    if (type == NormType::LayerNorm) {
      for (int64_t c = 0; c < C; ++c) mean += xr[c];
      mean /= C;
    }
    for (int64_t c = 0; c < C; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    const int k = fixed_uses_pos0(row0 + n, T, 0, -1) ? 0 : 2;
    sums[k] += std::sqrt(var / C + eps);
    sums[k + 1] += 1.0;
  }
}

}  // namespace cpu

LNS_REGISTER_OPS(Device::CPU) {
  LNS_REGISTER_OP(norm_forward, cpu::norm_forward);
  LNS_REGISTER_OP(residual_norm_forward, cpu::residual_norm_forward);
  LNS_REGISTER_OP(norm_backward, cpu::norm_backward);
  LNS_REGISTER_OP(norm_forward_fixed, cpu::norm_forward_fixed);
  LNS_REGISTER_OP(norm_backward_fixed, cpu::norm_backward_fixed);
  LNS_REGISTER_OP(norm_divisor_sums, cpu::norm_divisor_sums);
}

}  // namespace lns
