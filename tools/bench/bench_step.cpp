// Times full training steps (forward, backward, clipping, AdamW) of a config on
// synthetic tokens and prints ms/step, tokens/s and achieved GFLOP/s.
//   lns_bench_step --flagfile=configs/tiny_lns.flags [--hidden_size=512 ...] --bench_steps=10
#include <gflags/gflags.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "lns/errors.h"
#include "lns/model_flags.h"
#include "lns/train_flags.h"
#include "lns/trainer.h"

DEFINE_int32(bench_steps, 10, "Timed steps.");
DEFINE_int32(bench_warmup, 2, "Untimed steps first.");

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;  // quiet: the numbers are the output
  google::InitGoogleLogging(argv[0]);
  try {
    const lns::LlamaConfig mc = lns::config_from_flags();
    lns::TrainConfig tc = lns::train_config_from_flags();
    tc.data = "random";
    tc.val_data.clear();
    tc.out_dir.clear();
    tc.steps = FLAGS_bench_warmup + FLAGS_bench_steps;
    lns::Trainer trainer(mc, tc);
    std::vector<double> ms;
    for (int i = 0; i < tc.steps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      trainer.train_step();
      const double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (i >= FLAGS_bench_warmup) ms.push_back(dt);
    }
    std::sort(ms.begin(), ms.end());
    double mean = 0;
    for (double m : ms) mean += m / ms.size();
    const double median = ms[ms.size() / 2];
    const double tokens = double(tc.global_batch) * tc.seq_len;
    std::printf("config: hidden %d, layers %d, heads %d/%d, intermediate %d, vocab %d, seq %lld, "
                "batch %lld (micro %lld), %.2fM parameters\n",
                mc.hidden_size, mc.num_layers, mc.num_heads, mc.num_kv_heads, mc.intermediate_size,
                mc.vocab_size, (long long)tc.seq_len, (long long)tc.global_batch,
                (long long)tc.micro_batch, trainer.model().params().numel() / 1e6);
    std::printf("step: median %.1f ms, mean %.1f ms over %zu steps | %.0f tokens/s | %.1f GFLOP/s\n",
                median, mean, ms.size(), tokens / (median / 1e3),
                double(trainer.flops_per_token()) * tokens / (median / 1e3) / 1e9);
    std::printf("RESULT {\"impl\": \"lns\", \"median_ms\": %.3f, \"mean_ms\": %.3f, \"tokens_per_s\": %.1f}\n",
                median, mean, tokens / (median / 1e3));
  } catch (const lns::UserError& e) {
    std::fprintf(stderr, "lns_bench_step: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
