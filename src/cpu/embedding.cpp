#include <cstring>

#include "cpu/check.h"
#include "lns/ops.h"

namespace lns {

void embedding_forward(Tensor out, Tensor ids, Tensor weight) {
  cpu::require_cpu({&out, &ids, &weight});
  const int64_t N = ids.numel(), V = weight.dim(0), C = weight.dim(1);
  LNS_CHECK(out.numel() == N * C);
  const int32_t* id = ids.i32();
  const float* w = weight.f32();
  float* o = out.f32();
  for (int64_t n = 0; n < N; ++n) {
    LNS_CHECK(id[n] >= 0 && id[n] < V) << "token id " << id[n] << " outside [0, " << V << ")";
    std::memcpy(o + n * C, w + id[n] * C, C * sizeof(float));
  }
}

void embedding_backward(Tensor dweight, Tensor ids, Tensor dout) {
  cpu::require_cpu({&dweight, &ids, &dout});
  const int64_t N = ids.numel(), C = dweight.dim(1);
  const int32_t* id = ids.i32();
  const float* d = dout.f32();
  float* dw = dweight.f32();
  for (int64_t n = 0; n < N; ++n) {
    float* row = dw + int64_t{id[n]} * C;
    for (int64_t c = 0; c < C; ++c) row[c] += d[n * C + c];
  }
}

}  // namespace lns
