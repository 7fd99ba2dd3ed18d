// What FP8 casts once and shares, against casting at every use, on either device
// (test_fp8_linear.cpp on the CPU, test_cuda.cpp on CUDA and its emulator): an input
// that several linears read (linear_*_fp8_shared), and the weights cast once per step
// (Fp8State::begin_step, fp8_cast_weight).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "lns/core/device.h"
#include "lns/model/fp8_state.h"
#include "lns/core/ops.h"
#include "lns/model/stage.h"
#include "test_util.h"

namespace lns::test {

// A tensor of `dtype` on `device` holding v (rounded once to bf16 where dtype is BF16).
inline OwnedTensor fp8_test_tensor(const std::vector<float>& v, Shape shape, DType dtype, Device device) {
  OwnedTensor f(DType::F32, shape, device), t(dtype, shape, device);
  copy_tensor(f, Tensor{const_cast<float*>(v.data()), DType::F32, Device::CPU, shape});
  if (dtype == DType::F32) return f;
  cast(t, f);
  return t;
}

// Three linears reading one x (outputs 48, 16 and 32 wide, as q, k and v) through the
// shared ops, against each through the one-linear ops with an x row of its own that
// holds the same scale: y, dx (the three products summed in the same order) and every
// dw equal bit for bit, and the group's x row recording x once where the single ops
// record it three times. Weights bf16 on CUDA (what the stage passes), f32 on the CPU.
inline void expect_shared_input_is_the_single_ops(Device device, bool blockwise) {
  const int64_t N = 32, in = 144, outs[3] = {48, 16, 32};
  const DType act = device == Device::CUDA ? DType::BF16 : DType::F32;
  const OwnedTensor x = fp8_test_tensor(randn(N * in, 1, 2.0f), {N, in}, act, device);
  // table rows: the group's x, then w and dy of each linear (1 + 2i, 2 + 2i), then the
  // single ops' own x rows (7, 8, 9)
  std::vector<float> t(10 * kFp8Fields, 0.0f);
  const float scale[10] = {32, 1024, 16384, 2048, 65536, 512, 8192, 32, 32, 32};
  for (int r = 0; r < 10; ++r)
    t[size_t(r * kFp8Fields + kFp8Scale)] = scale[r], t[size_t(r * kFp8Fields + kFp8ScaleInv)] = 1 / scale[r];
  const OwnedTensor shared_table = fp8_test_tensor(t, {10, kFp8Fields}, DType::F32, device);
  const OwnedTensor single_table = fp8_test_tensor(t, {10, kFp8Fields}, DType::F32, device);
  std::vector<OwnedTensor> w, dy, ys, yo, dws, dwo;
  std::vector<Tensor> wv, dyv, ysv, dwsv;
  std::vector<Fp8Linear> fs, fo;
  for (int i = 0; i < 3; ++i) {
    const int64_t out = outs[i];
    w.push_back(fp8_test_tensor(randn(out * in, 2 + i, 0.05f), {out, in}, act, device));
    dy.push_back(fp8_test_tensor(randn(N * out, 5 + i, 1e-3f), {N, out}, act, device));
    ys.emplace_back(act, Shape{N, out}, device), yo.emplace_back(act, Shape{N, out}, device);
    dws.push_back(fp8_test_tensor(randn(out * in, 8 + i, 0.01f), {out, in}, DType::F32, device));
    dwo.push_back(fp8_test_tensor(randn(out * in, 8 + i, 0.01f), {out, in}, DType::F32, device));
    wv.push_back(w.back()), dyv.push_back(dy.back()), ysv.push_back(ys.back()), dwsv.push_back(dws.back());
    fs.push_back({shared_table, 0, 1 + 2 * i, 2 + 2 * i, blockwise});
    fo.push_back({single_table, 7 + i, 1 + 2 * i, 2 + 2 * i, blockwise});
  }
  OwnedTensor dxs = fp8_test_tensor(randn(N * in, 11, 0.1f), {N, in}, act, device);
  OwnedTensor dxo = fp8_test_tensor(randn(N * in, 11, 0.1f), {N, in}, act, device);
  linear_forward_fp8_shared(ysv, x, wv, fs);
  linear_backward_fp8_shared(dxs, dwsv, dyv, x, wv, /*accumulate_dx=*/true, fs);
  for (int i = 0; i < 3; ++i) {
    linear_forward_fp8(yo[size_t(i)], x, w[size_t(i)], fo[size_t(i)]);
    linear_backward_fp8(dxo, dwo[size_t(i)], dy[size_t(i)], x, w[size_t(i)], true, fo[size_t(i)]);
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(to_host_f32(ys[size_t(i)]), to_host_f32(yo[size_t(i)])) << "y of linear " << i;
    EXPECT_EQ(to_host_f32(dws[size_t(i)]), to_host_f32(dwo[size_t(i)])) << "dw of linear " << i;
  }
  EXPECT_EQ(to_host_f32(dxs), to_host_f32(dxo)) << "dx";
  const std::vector<float> ts = to_host_f32(shared_table), to = to_host_f32(single_table);
  EXPECT_EQ(ts[kFp8Elements], N * in) << "the group casts x once";
  for (int r = 7; r < 10; ++r) {
    EXPECT_EQ(to[size_t(r * kFp8Fields + kFp8Elements)], N * in) << "each single op casts x";
    EXPECT_EQ(to[size_t(r * kFp8Fields + kFp8Amax)], ts[kFp8Amax]);
    EXPECT_EQ(to[size_t(r * kFp8Fields + kFp8Flushed)], ts[kFp8Flushed]);
  }
  for (int r = 1; r < 7; ++r)
    for (int c = kFp8Amax; c < kFp8Fields; ++c)
      EXPECT_EQ(ts[size_t(r * kFp8Fields + c)], to[size_t(r * kFp8Fields + c)]) << "w and dy rows: row " << r;
}

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
