// Linear layers on OpenBLAS sgemm, row-major, weights [out, in] as torch.nn.Linear.
#include "cpu/check.h"
#include "lns/core/ops.h"

namespace lns {

namespace cpu {

void linear_forward(Tensor y, Tensor x, Tensor w) {
  cpu::require_cpu({&y, &x, &w});
  const int64_t N = cpu::rows_of(x), in = cpu::cols_of(x), out = w.dim(0);
  LNS_CHECK(w.dim(1) == in && y.numel() == N * out) << "linear: x " << x.shape.str() << " w "
                                                     << w.shape.str() << " y " << y.shape.str();
  if (N == 0) return;
  // y[N,out] = x[N,in] @ w[out,in]^T
  cpu::gemm_rows(CblasNoTrans, CblasTrans, N, out, in, 1.0f, x.f32(), in, w.f32(), in, 0.0f, y.f32(),
                 out);
}

void linear_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, bool accumulate_dx) {
  cpu::require_cpu({&dx, &dw, &dy, &x, &w});
  const int64_t N = cpu::rows_of(x), in = cpu::cols_of(x), out = w.dim(0);
  LNS_CHECK(dy.numel() == N * out && dw.numel() == out * in);
  if (N == 0) return;
  if (!dx.empty()) {
    LNS_CHECK(dx.numel() == N * in);
    // dx[N,in] (+)= dy[N,out] @ w[out,in]
    cpu::gemm_rows(CblasNoTrans, CblasNoTrans, N, in, out, 1.0f, dy.f32(), out, w.f32(), in,
                   accumulate_dx ? 1.0f : 0.0f, dx.f32(), in);
  }
  // dw[out,in] += dy^T[out,N] @ x[N,in]
  cpu::gemm_rows(CblasTrans, CblasNoTrans, out, in, N, 1.0f, dy.f32(), out, x.f32(), in, 1.0f,
                 dw.f32(), in);
}

}  // namespace cpu

LNS_REGISTER_OPS(Device::CPU) {
  LNS_REGISTER_OP(linear_forward, cpu::linear_forward);
  LNS_REGISTER_OP(linear_backward, cpu::linear_backward);
}

}  // namespace lns
