#include <cstring>

#include "cpu/check.h"
#include "lns/core/ops.h"

namespace lns {

namespace cpu {

void embedding_forward(Tensor out, Tensor ids, Tensor weight, int64_t row_begin) {
  cpu::require_cpu({&out, &ids, &weight});
  const int64_t N = ids.numel(), rows = weight.dim(0), C = weight.dim(1);
  LNS_CHECK(out.numel() == N * C);
  const int32_t* id = ids.i32();
  const float* w = weight.f32();
  float* o = out.f32();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const int64_t r = id[n] - row_begin;
    if (r >= 0 && r < rows)
      std::memcpy(o + n * C, w + r * C, C * sizeof(float));
    else
      std::memset(o + n * C, 0, C * sizeof(float));
  }
}

void embedding_backward(Tensor dweight, Tensor ids, Tensor dout, int64_t row_begin) {
  cpu::require_cpu({&dweight, &ids, &dout});
  const int64_t N = ids.numel(), rows = dweight.dim(0), C = dweight.dim(1);
  const int32_t* id = ids.i32();
  const float* d = dout.f32();
  float* dw = dweight.f32();
  for (int64_t n = 0; n < N; ++n) {  // token order: repeated ids accumulate deterministically
    const int64_t r = id[n] - row_begin;
    if (r < 0 || r >= rows) continue;
    float* row = dw + r * C;
    for (int64_t c = 0; c < C; ++c) row[c] += d[n * C + c];
  }
}

}  // namespace cpu

LNS_REGISTER_OPS(Device::CPU) {
  LNS_REGISTER_OP(embedding_forward, cpu::embedding_forward);
  LNS_REGISTER_OP(embedding_backward, cpu::embedding_backward);
}

}  // namespace lns
