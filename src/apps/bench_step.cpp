// Times full training steps (forward, backward, clipping, AdamW) of a config on
// synthetic tokens and prints ms/step, tokens/s and achieved GFLOP/s; on a GPU also
// the peak memory and the MFU.
//   lns_bench_step --flagfile=configs/tiny_lns.flags [--hidden_size=512 ...] --bench_steps=10
//   lns_bench_step --flagfile=configs/1b_lns.flags --device=cuda [--peak_tflops=989]
// MFU = flops_per_token (Trainer::flops_per_token: 6 x matmul parameters + 12 x
// layers x hidden x seq for attention) x tokens/s / peak; the peak defaults to an
// H100 SXM's dense bf16 989 TFLOP/s on CUDA (--peak_tflops for another GPU).
#include <gflags/gflags.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <nlohmann/json.hpp>

#include "lns/cpu/cpu_info.h"
#include "lns/core/device.h"
#include "lns/core/errors.h"
#include "lns/model/model_flags.h"
#include "lns/core/op_profile.h"
#include "lns/train/train_flags.h"
#include "lns/train/trainer.h"

#ifdef LNS_CUDA_SIM
#include <cuda_runtime.h>

#include "cuda/sim/counters.h"
#endif

DEFINE_int32(bench_steps, 10, "Timed steps.");
DEFINE_int32(bench_warmup, 2, "Untimed steps first.");
DEFINE_bool(profile, false,
            "CUDA: after the timed steps, one more step with CUDA events around every op, printed as a "
            "table of where the step goes by class of work (lns/core/op_profile.h) and as 'PROFILE {json}'.");

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;  // quiet: the numbers are the output
  google::InitGoogleLogging(argv[0]);
  return lns::main_guard("lns_bench_step", [&] {
    const lns::LlamaConfig mc = lns::config_from_flags();
    lns::TrainConfig tc = lns::train_config_from_flags();
    tc.data = "random";
    tc.val_data.clear();
    tc.out_dir.clear();
    LNS_REQUIRE(FLAGS_bench_steps >= 1 && FLAGS_bench_warmup >= 0,
                "--bench_steps must be >= 1 and --bench_warmup >= 0");
    tc.steps = FLAGS_bench_warmup + FLAGS_bench_steps;
    const bool gpu = tc.device == lns::Device::CUDA;
    LNS_REQUIRE(!FLAGS_profile || gpu, "--profile times the ops of a CUDA step: it needs --device=cuda");
    size_t mem_base = 0, mem_peak = 0;
    if (gpu) {
      lns::bind_local_gpu(lns::local_rank_from_env());
      std::printf("GPU: %s\n", lns::current_gpu_description().c_str());
      if (tc.peak_tflops <= 0) tc.peak_tflops = 989.0;
      mem_base = lns::cuda_memory_in_use();  // the context, before the model
    }
    lns::Trainer trainer(mc, tc);
    // Configuration and backend first, then a line per step: stdout is line-buffered
    // (main_guard), so a run cut short by `timeout` still says what it ran and how far.
    std::printf("config: hidden %d, layers %d, heads %d/%d, intermediate %d, vocab %d, seq %lld, "
                "batch %lld (micro %lld), %.2fM parameters\n",
                mc.hidden_size, mc.num_layers, mc.num_heads, mc.num_kv_heads, mc.intermediate_size,
                mc.vocab_size, (long long)tc.seq_len, (long long)tc.global_batch,
                (long long)tc.micro_batch, trainer.model().params().numel() / 1e6);
    if (!gpu) {  // OPENBLAS_CORETYPE moves CPU figures by about 2x: every figure names its kernel
      std::printf("CPU: %s\n", lns::cpu_blas_info().c_str());
      if (const std::string w = lns::cpu_blas_warning(); !w.empty()) std::printf("warning: %s\n", w.c_str());
    }
    std::vector<double> ms;
#ifdef LNS_CUDA_SIM
    // The SIMT emulator (docs/cuda.md): what a step asks of the device is counted
    // exactly; its times are the CPU's emulation, not a GPU's, and are not printed.
    uint64_t launches = 0, syncs = 0, graphs = 0, kernels = 0;
#endif
    for (int i = 0; i < tc.steps; ++i) {
#ifdef LNS_CUDA_SIM
      const lns::sim::Counters before = lns::sim::counters();
#endif
      const auto t0 = std::chrono::steady_clock::now();
      trainer.train_step();
#ifdef LNS_CUDA_SIM
      if (gpu) lns::device_synchronize(lns::Device::CUDA);  // the step's queued work runs now
      launches = lns::sim::counters().launches - before.launches;
      syncs = lns::sim::counters().host_syncs - before.host_syncs;
      graphs = lns::sim::counters().graph_launches - before.graph_launches;
      kernels = lns::sim::counters().kernels_run - before.kernels_run;
#endif
      const double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (i >= FLAGS_bench_warmup) ms.push_back(dt);
      std::printf("step %d/%lld: %.1f ms%s\n", i + 1, (long long)tc.steps, dt, i < FLAGS_bench_warmup ? " (warm-up)" : "");
      if (i == 0) std::printf("%s\n", trainer.startup().line().c_str());
      if (gpu) mem_peak = std::max(mem_peak, std::max(lns::cuda_memory_in_use(), mem_base) - mem_base);
    }
    // The profiled step: its own wall time, the rows by class, and the rest (what no
    // op covers: copies, casts, collectives, the host's gaps between launches) so that
    // the rows add up to it.
    if (FLAGS_profile) {
      lns::op_profile_start();
      const auto t0 = std::chrono::steady_clock::now();
      trainer.train_step();
      const std::vector<lns::OpClassTime> rows = lns::op_profile_stop();
      const double step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      double covered = 0;
      int64_t ops = 0;
      for (const auto& r : rows) covered += r.ms, ops += r.ops;
      std::printf("profile of one step (%.1f ms with an event pair around each of %lld ops):\n", step_ms,
                  (long long)ops);
      std::printf("  %-48s %10s %7s %8s\n", "class of work", "ms", "share", "ops");
      nlohmann::json j = {{"step_ms", step_ms}, {"rows", nlohmann::json::array()}};
      auto row = [&](const std::string& name, double t, int64_t n) {
        std::printf("  %-48s %10.2f %6.1f%% %8lld\n", name.c_str(), t, 100 * t / step_ms, (long long)n);
        j["rows"].push_back({{"class", name}, {"ms", t}, {"ops", n}});
      };
      for (const auto& r : rows) row(r.name, r.ms, r.ops);
      row("other device work and host gaps (the rest)", step_ms - covered, 0);
      std::printf("PROFILE %s\n", j.dump().c_str());
    }
    // The figure is the median of the timed steps (the middle two's mean for an even
    // count, as Python's statistics.median: bench_step_torch.py's peer), with their min and
    // max beside it: run_gpu.sh times at least 10, as 3 to 5 cannot tell 1.10x from 1.15x.
    std::sort(ms.begin(), ms.end());
    double mean = 0;
    for (double m : ms) mean += m / ms.size();
    const size_t n = ms.size();
    const double median = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
    const double tokens = double(tc.global_batch) * tc.seq_len;
#ifdef LNS_CUDA_SIM
    if (gpu) {
      int dev = 0;
      cudaGetDevice(&dev);
      std::printf("emulated: counts are real, times are not (lns-sim, %s)\n", lns::current_gpu_description().c_str());
      std::printf("per step: %llu kernel launches and %llu CUDA graph launches (%llu kernels run), %llu "
                  "host-device synchronisations | device memory high-water mark %.1f MiB\n",
                  (unsigned long long)launches, (unsigned long long)graphs, (unsigned long long)kernels,
                  (unsigned long long)syncs, lns::sim::device_memory_peak(dev) / double(1 << 20));
      std::printf("RESULT {\"impl\": \"lns\", \"device\": \"cuda-emulated\", \"launches_per_step\": %llu, "
                  "\"graph_launches_per_step\": %llu, \"kernels_per_step\": %llu, \"host_syncs_per_step\": %llu, "
                  "\"peak_device_mib\": %.1f}\n",
                  (unsigned long long)launches, (unsigned long long)graphs, (unsigned long long)kernels,
                  (unsigned long long)syncs, lns::sim::device_memory_peak(dev) / double(1 << 20));
      return 0;
    }
#endif
    std::printf("step: median %.1f ms (min %.1f, max %.1f), mean %.1f ms over %zu steps | %.0f tokens/s | "
                "%.1f GFLOP/s\n",
                median, ms.front(), ms.back(), mean, n, tokens / (median / 1e3),
                double(trainer.flops_per_token()) * tokens / (median / 1e3) / 1e9);
    const double tps = tokens / (median / 1e3);
    if (!gpu) {
      std::printf("RESULT {\"impl\": \"lns\", \"median_ms\": %.3f, \"min_ms\": %.3f, \"max_ms\": %.3f, "
                  "\"steps\": %zu, \"mean_ms\": %.3f, \"tokens_per_s\": %.1f}\n",
                  median, ms.front(), ms.back(), n, mean, tps);
    } else {
      const double mfu = double(trainer.flops_per_token()) * tps / (tc.peak_tflops * 1e12);
      const double gib = mem_peak / double(1 << 30);
      std::printf("GPU: peak memory %.2f GiB (device total minus free, over the context) | MFU %.1f%% of %.0f TFLOP/s\n",
                  gib, 100 * mfu, tc.peak_tflops);
      std::printf("RESULT {\"impl\": \"lns\", \"device\": \"cuda\", \"median_ms\": %.3f, \"min_ms\": %.3f, "
                  "\"max_ms\": %.3f, \"steps\": %zu, \"mean_ms\": %.3f, "
                  "\"tokens_per_s\": %.1f, \"peak_mem_gib\": %.3f, \"mfu\": %.4f, \"peak_tflops\": %.1f, "
                  "\"startup_s\": %.2f, \"startup_weights_s\": %.2f}\n",
                  median, ms.front(), ms.back(), n, mean, tps, gib, mfu, tc.peak_tflops, trainer.startup().total(),
                  trainer.startup().weights);
    }
    return 0;
  });
}
