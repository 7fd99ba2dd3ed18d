// The Gumbel-routed block's ops (routed, mono, mono_reverse; include/lns/core/ops.h): the
// router's hard gate and the per-sequence mix of the two paths. CPU reference of
// src/cuda/route.cu. Every sum is f64 in index order.
#include <cmath>
#include <vector>

#include "cpu/check.h"
#include "lns/core/ops.h"

namespace lns {
namespace {

// mean_t x[b,t,:] for every b, f64                        x [B,T,C] -> m [B*C]
std::vector<double> sequence_means(const Tensor& x) {
  const int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2);
  std::vector<double> m(B * C, 0.0);
  const float* xp = x.f32();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) m[b * C + c] += xp[(b * T + t) * C + c];
  for (double& v : m) v /= double(T);
  return m;
}

}  // namespace

namespace cpu {

void route_gate_forward(Tensor gate, Tensor soft, Tensor x, Tensor w, Tensor noise) {
  cpu::require_cpu({&gate, &soft, &x, &w, &noise});
  const int64_t B = x.dim(0), C = x.dim(2);
  LNS_CHECK(x.shape.ndim == 3 && w.numel() == 2 * C && gate.numel() == 2 * B && soft.numel() == 2 * B &&
            noise.numel() == 2 * B);
  const std::vector<double> m = sequence_means(x);
  const float *wp = w.f32(), *g = noise.f32();
  for (int64_t b = 0; b < B; ++b) {
    double z[2];
    for (int k = 0; k < 2; ++k) {
      double dot = 0.0;
      for (int64_t c = 0; c < C; ++c) dot += m[b * C + c] * wp[k * C + c];
      z[k] = dot + g[b * 2 + k];
    }
    const double mx = std::max(z[0], z[1]), e0 = std::exp(z[0] - mx), e1 = std::exp(z[1] - mx);
    soft.f32()[b * 2] = float(e0 / (e0 + e1));
    soft.f32()[b * 2 + 1] = float(e1 / (e0 + e1));
    const int pick = z[1] > z[0] ? 1 : 0;
    gate.f32()[b * 2] = pick == 0 ? 1.0f : 0.0f;
    gate.f32()[b * 2 + 1] = pick == 1 ? 1.0f : 0.0f;
  }
}

void route_gate_backward(Tensor dx, Tensor dw, Tensor dgate, Tensor soft, Tensor x, Tensor w) {
  cpu::require_cpu({&dx, &dw, &dgate, &soft, &x, &w});
  const int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2);
  LNS_CHECK(x.shape.ndim == 3 && dx.numel() == x.numel() && w.numel() == 2 * C && dw.numel() == 2 * C &&
            dgate.numel() == 2 * B && soft.numel() == 2 * B);
  const std::vector<double> m = sequence_means(x);
  const float *s = soft.f32(), *dg = dgate.f32(), *wp = w.f32();
  std::vector<float> dl(2 * B);  // dlogits [B,2]
  for (int64_t b = 0; b < B; ++b) {
    const double dot = double(dg[b * 2]) * s[b * 2] + double(dg[b * 2 + 1]) * s[b * 2 + 1];
    for (int k = 0; k < 2; ++k) dl[b * 2 + k] = float(s[b * 2 + k] * (dg[b * 2 + k] - dot));
  }
  float* dwp = dw.f32();
  for (int k = 0; k < 2; ++k)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0.0;
      for (int64_t b = 0; b < B; ++b) acc += double(dl[b * 2 + k]) * m[b * C + c];
      dwp[k * C + c] += float(acc);
    }
  float* dxp = dx.f32();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < B * T; ++n) {
    const int64_t b = n / T;
    for (int64_t c = 0; c < C; ++c)
      dxp[n * C + c] += (dl[b * 2] * wp[c] + dl[b * 2 + 1] * wp[C + c]) / float(T);
  }
}

void route_mix_forward(Tensor y, Tensor p0, Tensor p1, Tensor gate) {
  cpu::require_cpu({&y, &p0, &p1, &gate});
  const int64_t B = gate.numel() / 2, n = y.numel(), per = n / B;  // per sequence: T*C
  LNS_CHECK(p0.numel() == n && p1.numel() == n && n % B == 0);
  const float *a = p0.f32(), *c = p1.f32(), *g = gate.f32();
  float* yp = y.f32();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) yp[i] = g[i / per * 2] * a[i] + g[i / per * 2 + 1] * c[i];
}

void route_mix_backward(Tensor dp0, Tensor dp1, Tensor dgate, Tensor dy, Tensor p0, Tensor p1, Tensor gate) {
  cpu::require_cpu({&dp0, &dp1, &dgate, &dy, &p0, &p1, &gate});
  const int64_t B = gate.numel() / 2, n = dy.numel(), per = n / B;
  LNS_CHECK(dp0.numel() == n && dp1.numel() == n && p0.numel() == n && p1.numel() == n && n % B == 0 &&
            dgate.numel() == 2 * B);
  const float *d = dy.f32(), *a = p0.f32(), *c = p1.f32(), *g = gate.f32();
  for (int64_t b = 0; b < B; ++b) {  // the sums first: dp0/dp1 may be written over p0/p1's callers
    double s0 = 0.0, s1 = 0.0;
    for (int64_t i = b * per; i < (b + 1) * per; ++i) s0 += double(d[i]) * a[i], s1 += double(d[i]) * c[i];
    dgate.f32()[b * 2] = float(s0), dgate.f32()[b * 2 + 1] = float(s1);
  }
  float *o0 = dp0.f32(), *o1 = dp1.f32();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float dv = d[i];
    o0[i] = g[i / per * 2] * dv, o1[i] = g[i / per * 2 + 1] * dv;
  }
}

}  // namespace cpu

LNS_REGISTER_OPS(Device::CPU) {
  LNS_REGISTER_OP(route_gate_forward, cpu::route_gate_forward);
  LNS_REGISTER_OP(route_gate_backward, cpu::route_gate_backward);
  LNS_REGISTER_OP(route_mix_forward, cpu::route_mix_forward);
  LNS_REGISTER_OP(route_mix_backward, cpu::route_mix_backward);
}

}  // namespace lns
