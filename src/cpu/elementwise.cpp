#include "cpu/check.h"
#include "lns/core/bf16.h"
#include "lns/core/ops.h"

namespace lns {

namespace cpu {

void axpby(Tensor y, float a, Tensor x, float b) {
  cpu::require_cpu({&y, &x});
  LNS_CHECK(y.numel() == x.numel());
  float* yp = y.f32();
  const float* xp = x.f32();
  const int64_t n = y.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) yp[i] = a * yp[i] + b * xp[i];
}

void cast(Tensor dst, Tensor src) {
  cpu::require_cpu({&dst, &src});
  LNS_CHECK(dst.numel() == src.numel());
  const int64_t n = src.numel();
  if (dst.dtype == DType::BF16 && src.dtype == DType::F32) {
    auto* d = static_cast<uint16_t*>(dst.data);
    const float* s = src.f32();
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
  } else if (dst.dtype == DType::F32 && src.dtype == DType::BF16) {
    const auto* s = static_cast<const uint16_t*>(src.data);
    float* d = dst.f32();
    for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
  } else {
    LNS_CHECK(false) << "cast from " << dtype_name(src.dtype) << " to " << dtype_name(dst.dtype);
  }
}

// r = a*x + f                                              x, f, r [N*C]; alpha [1]
void scaled_residual_forward(Tensor r, Tensor x, Tensor f, Tensor alpha) {
  cpu::require_cpu({&r, &x, &f, &alpha});
  LNS_CHECK(r.numel() == x.numel() && f.numel() == x.numel() && alpha.numel() == 1);
  const float a = alpha.f32()[0];
  float* rp = r.f32();
  const float *xp = x.f32(), *fp = f.f32();
  const int64_t n = r.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) rp[i] = a * xp[i] + fp[i];
}

// dalpha += sum(dr*x) in index order (f64), then dx = a*dr  dr, x, dx [N*C]; alpha, dalpha [1]
void scaled_residual_backward(Tensor dx, Tensor dalpha, Tensor dr, Tensor x, Tensor alpha) {
  cpu::require_cpu({&dx, &dalpha, &dr, &x, &alpha});
  LNS_CHECK(dx.numel() == dr.numel() && x.numel() == dr.numel() && alpha.numel() == 1 && dalpha.numel() == 1);
  const float a = alpha.f32()[0];
  const float *drp = dr.f32(), *xp = x.f32();
  float* dxp = dx.f32();
  const int64_t n = dr.numel();
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += double(drp[i]) * xp[i];  // before dx overwrites an aliased dr
  dalpha.f32()[0] += static_cast<float>(s);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dxp[i] = a * drp[i];
}

}  // namespace cpu

LNS_REGISTER_OPS(Device::CPU) {
  LNS_REGISTER_OP(axpby, cpu::axpby);
  LNS_REGISTER_OP(cast, cpu::cast);
  LNS_REGISTER_OP(scaled_residual_forward, cpu::scaled_residual_forward);
  LNS_REGISTER_OP(scaled_residual_backward, cpu::scaled_residual_backward);
}

}  // namespace lns
