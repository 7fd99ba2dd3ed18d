#include "core/dispatch.h"
#include "cpu/check.h"
#include "lns/bf16.h"
#include "lns/ops.h"

namespace lns {

void axpby(Tensor y, float a, Tensor x, float b) {
  LNS_DISPATCH(y, axpby(y, a, x, b));
  cpu::require_cpu({&y, &x});
  LNS_CHECK(y.numel() == x.numel());
  float* yp = y.f32();
  const float* xp = x.f32();
  const int64_t n = y.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) yp[i] = a * yp[i] + b * xp[i];
}

void cast(Tensor dst, Tensor src) {
  LNS_DISPATCH(src, cast(dst, src));
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

}  // namespace lns
