// Three training steps of a small model with and without --cuda_graphs, for the tests
// that compare them: on a GPU (test_graphs_cuda.cpp) and under the emulator with its
// launch counters (test_sim_checks.cpp). The first step runs ungraphed, the second
// records, the third records again (grad_scale and pointers are read at record time).
#pragma once

#include <functional>
#include <vector>

#include "lns/core/device.h"
#include "lns/train/trainer.h"
#include "tests/common/test_util.h"

namespace lns::test {

struct GraphedSteps {
  std::vector<double> losses;  // [3]
  std::vector<float> weights;  // [P] after the third step
};

// `around(step, after)` runs before and after each step, synchronised, e.g. to read counters.
inline GraphedSteps run_graphed_steps(NormScheme scheme, int micro_batches, bool graphed,
                                      const std::function<void(int, bool)>& around = {}) {
  LlamaConfig c;
  c.vocab_size = 61, c.hidden_size = 32, c.intermediate_size = 45, c.num_layers = 2;
  c.num_heads = 4, c.num_kv_heads = 2, c.norm_scheme = scheme;
  TrainConfig tc;
  tc.device = Device::CUDA;
  tc.seq_len = 16, tc.global_batch = micro_batches, tc.micro_batch = 1, tc.steps = 3;
  tc.cuda_graphs = graphed;
  Trainer tr(c, tc);
  GraphedSteps r;
  for (int step = 0; step < 3; ++step) {
    device_synchronize(Device::CUDA);
    if (around) around(step, false);
    r.losses.push_back(tr.train_step().loss);
    device_synchronize(Device::CUDA);
    if (around) around(step, true);
  }
  r.weights = to_host_f32(tr.model().params().flat_params());
  return r;
}

}  // namespace lns::test
