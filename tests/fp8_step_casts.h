// The FP8 weights cast once per step (Fp8State::begin_step, fp8_cast_weight) against
// the ops casting w at every call, for a stage on either device (test_fp8_linear.cpp on
// the CPU, test_cuda.cpp on CUDA and its emulator).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "lns/fp8_state.h"
#include "lns/stage.h"
#include "test_util.h"

namespace lns::test {

// Two stages from the same weights train two steps of two micro-batches each, with a
// plain SGD update between steps: `cached` opens each step with begin_step, `per_call`
// never does (so its ops cast w at each forward and backward). The step casts are the
// same codes, so losses and gradients must be equal bit for bit at every step; a step
// cast left over from the weights before an update (begin_step not casting again)
// breaks that from step 2. The health rows are equal except w's element count: the
// step cast records w once, the per-call casts once per forward.
inline void expect_step_casts_are_per_call_casts(const LlamaConfig& c, Device device) {
  const int64_t B = 2, T = 16, M = 2;
  LlamaStage cached(c, StageSpec::whole(c), B, T, 1, {}, device), per_call(c, StageSpec::whole(c), B, T, 1, {}, device);
  cached.init_weights(7), per_call.init_weights(7);
  ASSERT_NE(cached.fp8(), nullptr);
  for (int step = 0; step < 2; ++step) {
    cached.fp8()->begin_step();
    ASSERT_TRUE(cached.fp8()->step_casts());
    ASSERT_FALSE(per_call.fp8()->step_casts());
    for (int m = 0; m < M; ++m) {
      std::vector<int32_t> ids(B * T), tg(B * T);
      for (int64_t i = 0; i < B * T; ++i)
        ids[i] = int32_t((i * 7 + 3 * m + step) % c.vocab_size), tg[i] = int32_t((i * 5 + m + 1) % c.vocab_size);
      double loss[2];
      LlamaStage* stages[2] = {&cached, &per_call};
      for (int k = 0; k < 2; ++k) {
        stages[k]->forward(Tensor{ids.data(), DType::I32, Device::CPU, {B, T}});
        loss[k] = stages[k]->loss(Tensor{tg.data(), DType::I32, Device::CPU, {B * T}});
        stages[k]->backward({}, 1.0f / (M * B * T));
      }
      ASSERT_EQ(loss[0], loss[1]) << "step " << step + 1 << " micro-batch " << m;
    }
    const std::vector<Fp8Health> hc = cached.fp8()->end_step({}), hp = per_call.fp8()->end_step({});
    EXPECT_FALSE(cached.fp8()->step_casts()) << "end_step drops the step casts";
    ASSERT_EQ(hc.size(), hp.size());
    for (size_t r = 0; r < hc.size(); ++r) {
      EXPECT_EQ(hc[r].amax, hp[r].amax) << hc[r].name;
      EXPECT_EQ(hc[r].saturated * (hc[r].tensor == 1 ? M : 1), hp[r].saturated) << hc[r].name;
      EXPECT_EQ(hc[r].flushed * (hc[r].tensor == 1 ? M : 1), hp[r].flushed) << hc[r].name;
      EXPECT_EQ(hc[r].elements * (hc[r].tensor == 1 ? M : 1), hp[r].elements) << hc[r].name;
    }
    ParamSet &pc = cached.params(), &pp = per_call.params();
    pc.download(/*grads=*/true), pp.download(/*grads=*/true);
    for (int i = 0; i < pc.size(); ++i) {
      const Tensor gc = pc.host_grad(i), gp = pp.host_grad(i);
      const std::vector<float> a(gc.f32(), gc.f32() + gc.numel()), b(gp.f32(), gp.f32() + gp.numel());
      ASSERT_EQ(a, b) << pc.info(i).name << " at step " << step + 1;
      float* wc = pc.host_param(i).f32();
      float* wp = pp.host_param(i).f32();
      for (int64_t k = 0; k < gc.numel(); ++k) wc[k] -= 0.5f * a[size_t(k)], wp[k] -= 0.5f * a[size_t(k)];
    }
    pc.upload(), pp.upload();  // and the bf16 copies on CUDA
    pc.zero_grads(), pp.zero_grads();
  }
}

}  // namespace lns::test
