// GPU kernel throughput of the CUDA backend, next to the ceilings it is judged by:
//   copy_<size>              device-to-device copy, bytes read + written per second
//   rmsnorm_fwd_<N>x<C>      fused residual add + RMSNorm + LNS scale: reads res, delta,
//                            writes res_out, out: 4*N*C*2 bytes (the C-wide gain ignored)
//   rmsnorm_bwd_<N>x<C>      reads dout, x, dres, writes dx: 4*N*C*2 bytes (rstd and
//                            the dgain partials ignored)
//   gemm_<name>_<M>x<N>x<K>  linear_forward x[M,K] @ W[N,K]^T through cuBLASLt, bf16 in,
//                            f32 accumulation, bf16 out: 2*M*N*K FLOP
//                            (gate_up_stored, down_stored: the FFN padded as the device
//                            stores it, the step's own shape)
//   gemm_{fwd,dgrad,wgrad}_<linear>_<M>x<N>x<K>  each product of the step's linears as
//                            linear_forward/backward run it (dgrad bf16 out; wgrad f32 out
//                            with beta 1), at the stored FFN width, plus qkv_fused and
//                            gate_up_fused (one product for q, k, v and for gate, up); each
//                            record's best_candidate is the fastest of the heuristic's
//                            candidates (-1: the one the step runs)
//   gemm_fp8_<name>_<M>x<N>x<K>, gemm_fp8bw_<name>_...  the same products in FP8 as
//                            --fp8 runs them (src/cuda/fp8_linear.cpp): E4M3 x E4M3 with
//                            per-tensor scales, and with 1x128 / 128x128 tile scales
//   fp8_cast_<N>x<C>         --fp8=delayed's cast of an activation: reads x bf16, writes
//                            its E4M3 codes and the health (recorded): 3*N*C bytes;
//                            fp8_cast_t_ also writes the transpose (4*N*C);
//                            fp8_tiles_rows_ / fp8_tiles_cols_ blockwise's 1x128 and
//                            128x1 tile casts (3*N*C each; their factors ignored)
//   attention_<impl>_{fwd,bwd}_<B>x<T>x<Hq>x<Hkv>x<D>  causal attention at the model's
//                            shape (--micro_batch_size, --seq_len; and T = 4096 at batch
//                            1), impl fused or materialized (docs/cuda.md), counted as
//                            the causal FLOPs: forward 2*B*Hq*T*T*D, backward 2.5x that
// Names and byte counts are those of tools/bench/bench_kernels_torch.py, so
// tools/device/summarize.py pairs the two. Timing: CUDA events around each call,
// median over --iters calls after --warmup untimed ones.
// Operands are random and shaped like a trained model's (random_operand below): a constant
// or short-period operand toggles fewer bits, draws less power and runs faster than real
// data. --operand_stats prints each operand's mean and standard deviation as the device
// holds it. --json is rewritten after every figure, so a run cut off keeps what finished.
//   lns_bench_kernels [--json=PATH] [--flagfile=configs/1b_lns.flags] [--tokens=2048,8192] [--long_seq=4096]
//                     [--sections=copy,norm,gemm,step_gemm,fp8,attention] [--operand_stats] [--seed=1234]
#include <cuda_runtime.h>
#include <gflags/gflags.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include <absl/strings/numbers.h>
#include <absl/strings/str_split.h>

#include "cuda/fp8_cast.h"
#include "cuda/fp8_tiles.h"
#include "cuda/gemm.h"
#include "cuda/runtime.h"
#include "lns/core/device.h"
#include "lns/core/fp8_linear.h"
#include "lns/core/errors.h"
#include "lns/model/model_flags.h"
#include "lns/core/ops.h"
#include "lns/core/rng.h"

DEFINE_string(json, "", "Also write the figures here as JSON.");
DEFINE_string(tokens, "", "GEMM M values, comma-separated (default: micro_batch_size*seq_len and 8192).");
DEFINE_string(norm_shapes, "8192x2048,8192x4096", "N x C of the norm benchmarks.");
DEFINE_int32(copy_mib, 1024, "Size of the large copy in MiB.");
DEFINE_int32(iters, 50, "Timed calls per figure.");
DEFINE_int32(warmup, 10, "Untimed calls first.");
DEFINE_double(scale, 0.2, "LNS output scale 1/sqrt(l) of the norm benchmark (0.2 = layer 25).");
DEFINE_int32(long_seq, 4096, "Sequence length of the batch-1 attention figures (0: none).");
DEFINE_string(sections, "copy,norm,gemm,step_gemm,fp8,attention",
              "Which figures to measure: copy, norm, gemm, step_gemm (the step's GEMMs pass by pass, the fused "
              "q/k/v and gate/up shapes, and every candidate cuBLASLt's heuristic gives each), fp8, attention.");
DEFINE_bool(operand_stats, false,
            "Print each operand's mean and standard deviation, read back from the device (a check that "
            "the operands are what they should be; costs a copy of each).");
DECLARE_int32(micro_batch_size);
DECLARE_int32(seq_len);
DECLARE_uint64(seed);

namespace lns {
namespace {

double time_ms(const std::function<void()>& f) {
  cudaStream_t s = cuda::stream();
  for (int i = 0; i < FLAGS_warmup; ++i) f();
  cudaEvent_t a, b;
  LNS_CUDA_CHECK(cudaEventCreate(&a));
  LNS_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < FLAGS_iters; ++i) {
    LNS_CUDA_CHECK(cudaEventRecord(a, s));
    f();
    LNS_CUDA_CHECK(cudaEventRecord(b, s));
    LNS_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    LNS_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// What an operand stands for, and so its values (normal(mean, std)):
//   Weight      a trained linear's weight: std 0.02 (the configs' --init_std; trained
//               weights keep about that scale)
//   Activation  a norm's output, an attention input, a residual or a gradient: unit RMS
//   Gain        a norm's gain: about 1
enum class Operand { Weight, Activation, Gain };

void print_operand_stats(const char* what, const OwnedTensor& t) {
  OwnedTensor f(DType::F32, t.t.shape, Device::CUDA);
  cast(f, t);
  std::vector<float> h(static_cast<size_t>(t.t.numel()));
  copy_tensor(Tensor{h.data(), DType::F32, Device::CPU, t.t.shape}, f);
  double sum = 0, sq = 0;
  for (float v : h) sum += v, sq += double(v) * v;
  const double n = double(h.size()), mean = sum / n;
  std::printf("operand %s [%lld]: mean %.5f std %.5f\n", what, (long long)t.t.numel(), mean,
              std::sqrt(std::max(0.0, sq / n - mean * mean)));
}

// A device tensor of DT filled with normal(mean, std) values from its own stream of the
// counter-based generator (lns/core/rng.h) under --seed: the same operands every run.
OwnedTensor random_operand(DType dt, Shape s, Operand kind, const char* what) {
  static uint64_t drawn = 0;  // each operand its own stream, in the order they are made
  const float mean = kind == Operand::Gain ? 1.0f : 0.0f;
  const float std = kind == Operand::Activation ? 1.0f : 0.02f;
  OwnedTensor t(dt, s, Device::CUDA);
  OwnedTensor f(DType::F32, s, Device::CUDA);
  std::vector<float> h(static_cast<size_t>(s.numel()));
  fill_normal(h.data(), s.numel(), mean, std, rng_key(FLAGS_seed, "lns_bench_kernels." + std::to_string(drawn++)));
  copy_tensor(f, Tensor{h.data(), DType::F32, Device::CPU, s});
  cast(t, f);
  if (FLAGS_operand_stats) print_operand_stats(what, t);
  return t;
}

struct Results {
  nlohmann::json records = nlohmann::json::array();
  void add(const std::string& name, const char* metric, double value, double ms, std::vector<int64_t> shape,
           const char* amount_key, double amount) {
    records.push_back({{"name", name}, {"metric", metric}, {"value", value}, {"ms", ms}, {"shape", shape},
                       {amount_key, amount}});
    save();  // first: a figure printed is one --json holds
    std::printf("%-36s %10.1f %-8s %10.1f us\n", name.c_str(), value, metric, ms * 1e3);
    std::fflush(stdout);
  }
  // --json after every figure (and again where a figure gains fields), written aside and
  // renamed over the last: a run killed at its limit leaves the figures that finished.
  void save() const {
    if (FLAGS_json.empty()) return;
    const std::string tmp = FLAGS_json + ".tmp";
    {
      std::ofstream f(tmp);
      LNS_REQUIRE(f.good(), "--json=", FLAGS_json, ": cannot write ", tmp);
      f << nlohmann::json{{"impl", "lns"}, {"device", current_gpu_description()}, {"results", records}}.dump(2)
        << "\n";
      LNS_REQUIRE(f.good(), "--json=", FLAGS_json, ": cannot write ", tmp);
    }
    LNS_REQUIRE(std::rename(tmp.c_str(), FLAGS_json.c_str()) == 0, "--json=", FLAGS_json, ": cannot rename ", tmp,
                " over it");
  }
};

std::vector<std::pair<int64_t, int64_t>> parse_shapes(const std::string& s) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (absl::string_view item : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    std::vector<std::string> nc = absl::StrSplit(item, 'x');
    int64_t n = 0, c = 0;
    LNS_REQUIRE(nc.size() == 2 && absl::SimpleAtoi(nc[0], &n) && absl::SimpleAtoi(nc[1], &c) && n > 0 && c > 0,
                "--norm_shapes: expected NxC,NxC..., got '", s, "'");
    out.push_back({n, c});
  }
  return out;
}

int run() {
  const std::set<std::string> known = {"copy", "norm", "gemm", "step_gemm", "fp8", "attention"};
  std::set<std::string> sections;
  for (absl::string_view item : absl::StrSplit(FLAGS_sections, ',', absl::SkipEmpty())) {
    LNS_REQUIRE(known.count(std::string(item)), "--sections: '", item,
                "' is not one of copy, norm, gemm, step_gemm, fp8, attention");
    sections.insert(std::string(item));
  }
  const auto on = [&](const char* s) { return sections.count(s) > 0; };
  LNS_REQUIRE(cuda_device_count() > 0, "lns_bench_kernels needs a GPU: ", cuda_unavailable_reason());
  bind_local_gpu(0);
  const LlamaConfig cfg = config_from_flags();
  std::printf("GPU: %s\n", current_gpu_description().c_str());
  Results r;

  // ---- copy ceilings ------------------------------------------------------------------
  const auto norms = parse_shapes(FLAGS_norm_shapes);
  std::vector<std::pair<std::string, int64_t>> copies = {
      {"copy_" + std::to_string(FLAGS_copy_mib) + "MiB", int64_t(FLAGS_copy_mib) << 19}};
  for (auto [n, c] : norms) copies.push_back({"copy_" + std::to_string(n) + "x" + std::to_string(c), n * c});
  for (const auto& [name, numel] : on("copy") ? copies : decltype(copies){}) {
    OwnedTensor a(DType::BF16, Shape{numel}, Device::CUDA), b(DType::BF16, Shape{numel}, Device::CUDA);
    const double ms = time_ms([&] {
      LNS_CUDA_CHECK(cudaMemcpyAsync(b.t.data, a.t.data, a.t.nbytes(), cudaMemcpyDeviceToDevice, cuda::stream()));
    });
    const double bytes = 2.0 * a.t.nbytes();
    r.add(name, "GB/s", bytes / ms / 1e6, ms, {numel}, "bytes", bytes);
  }

  // ---- fused residual + RMSNorm + LNS scale ------------------------------------------
  for (auto [N, C] : on("norm") ? norms : decltype(norms){}) {
    OwnedTensor res = random_operand(DType::BF16, {N, C}, Operand::Activation, "norm res"),
                delta = random_operand(DType::BF16, {N, C}, Operand::Activation, "norm delta"),
                out(DType::BF16, Shape{N, C}, Device::CUDA), res_out(DType::BF16, Shape{N, C}, Device::CUDA),
                dout = random_operand(DType::BF16, {N, C}, Operand::Activation, "norm dout"),
                dres = random_operand(DType::BF16, {N, C}, Operand::Activation, "norm dres"),
                dx(DType::BF16, Shape{N, C}, Device::CUDA),
                gain = random_operand(DType::F32, {C}, Operand::Gain, "norm gain"),
                dgain(DType::F32, Shape{C}, Device::CUDA), rstd(DType::F32, Shape{N}, Device::CUDA);
    const std::string shape = std::to_string(N) + "x" + std::to_string(C);
    const double bytes = 4.0 * N * C * 2;
    const float scale = static_cast<float>(FLAGS_scale);
    double ms = time_ms([&] {
      residual_norm_forward(NormType::RMSNorm, res_out, out, {}, rstd, res, delta, 1.0f, gain, {}, scale, 1e-5f);
    });
    r.add("rmsnorm_fwd_" + shape, "GB/s", bytes / ms / 1e6, ms, {N, C}, "bytes", bytes);
    ms = time_ms([&] { norm_backward(NormType::RMSNorm, dx, dgain, {}, dres, dout, res_out, {}, rstd, gain, scale); });
    r.add("rmsnorm_bwd_" + shape, "GB/s", bytes / ms / 1e6, ms, {N, C}, "bytes", bytes);
  }

  // ---- GEMMs at the model's shapes ------------------------------------------------------
  std::vector<int64_t> tokens;
  if (FLAGS_tokens.empty()) {
    tokens = {int64_t(FLAGS_micro_batch_size) * FLAGS_seq_len, 8192};
    std::sort(tokens.begin(), tokens.end());
    tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
  } else {
    for (absl::string_view t : absl::StrSplit(FLAGS_tokens, ',', absl::SkipEmpty())) {
      int64_t m = 0;
      LNS_REQUIRE(absl::SimpleAtoi(t, &m) && m > 0, "--tokens: expected positive integers, got '", FLAGS_tokens, "'");
      tokens.push_back(m);
    }
  }
  const int64_t C = cfg.hidden_size, F = cfg.intermediate_size, V = cfg.vocab_size, KV = cfg.kv_dim();
  std::vector<std::tuple<std::string, int64_t, int64_t>> gemms = {
      {"qkvo", C, C}, {"gate_up", F, C}, {"down", C, F}, {"lm_head", V, C}};
  if (KV != C) gemms.insert(gemms.begin() + 1, {"kv", KV, C});
  // The FFN as the device stores it (padded to gemm_dim_align: 5461 -> 5504), the step's shape
  const int64_t align = gemm_dim_align(Device::CUDA), Fs = (F + align - 1) / align * align;
  if (Fs != F) gemms.insert(gemms.end() - 1, {{"gate_up_stored", Fs, C}, {"down_stored", C, Fs}});
  std::printf("GEMM shapes: hidden %lld, intermediate %lld, vocab %lld\n", (long long)C, (long long)F, (long long)V);
  for (int64_t M : on("gemm") ? tokens : decltype(tokens){})
    for (const auto& [name, N, K] : gemms) {
      OwnedTensor x = random_operand(DType::BF16, {M, K}, Operand::Activation, "gemm x"),
                  w = random_operand(DType::BF16, {N, K}, Operand::Weight, "gemm w"),
                  y(DType::BF16, Shape{M, N}, Device::CUDA);
      const double ms = time_ms([&] { linear_forward(y, x, w); });
      const double flop = 2.0 * M * N * K;
      r.add("gemm_" + name + "_" + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K), "TFLOP/s",
            flop / ms / 1e9, ms, {M, N, K}, "flops", flop);
    }

  // ---- the step's GEMMs, each pass as the linears run it, and the heuristic's other
  // candidates: whether keeping the fastest candidate (instead of the first that runs)
  // or one product for q, k, v (gate, up) would pay, before either is built -------------
  if (on("step_gemm")) {
    const int64_t M = int64_t(FLAGS_micro_batch_size) * FLAGS_seq_len;  // the step's rows
    std::vector<std::tuple<std::string, int64_t, int64_t>> linears = {
        {"q", C, C}, {"kv", KV, C}, {"o", C, C}, {"gate", Fs, C}, {"down", C, Fs}, {"lm_head", V, C},
        {"qkv_fused", C + 2 * KV, C}, {"gate_up_fused", 2 * Fs, C}};
    if (KV == C) linears.erase(linears.begin() + 1);  // kv is q's shape
    for (const auto& [name, out, in] : linears) {
      // y: the forward's output and the backward's incoming gradient (dy), unit RMS
      OwnedTensor x = random_operand(DType::BF16, {M, in}, Operand::Activation, "step_gemm x"),
                  w = random_operand(DType::BF16, {out, in}, Operand::Weight, "step_gemm w"),
                  y = random_operand(DType::BF16, {M, out}, Operand::Activation, "step_gemm dy"),
                  dx(DType::BF16, Shape{M, in}, Device::CUDA),
                  dw(DType::F32, Shape{out, in}, Device::CUDA);
      const std::pair<const char*, cuda::GemmArgs> passes[] = {
          {"fwd", cuda::linear_forward_args(y.t.data, DType::BF16, x.t.data, w.t.data, M, in, out)},
          {"dgrad", cuda::linear_dgrad_args(dx.t.data, DType::BF16, y.t.data, w.t.data, M, in, out, false)},
          {"wgrad", cuda::linear_wgrad_args(static_cast<float*>(dw.t.data), y.t.data, x.t.data, M, in, out)}};
      const double flop = 2.0 * M * out * in;
      for (const auto& [pass, g] : passes) {
        const std::string shape = std::to_string(g.M) + "x" + std::to_string(g.N) + "x" + std::to_string(g.K);
        const double ms = time_ms([&] { cuda::gemm(g); });
        r.add(std::string("gemm_") + pass + "_" + name + "_" + shape, "TFLOP/s", flop / ms / 1e9, ms,
              {g.M, g.N, g.K}, "flops", flop);
        double best = ms;
        int best_i = -1;
        for (int i = 0, n = cuda::gemm_candidates(g); i < n; ++i) {
          if (!cuda::gemm_with_candidate(g, i)) continue;  // refused: launches nothing
          const double t = time_ms([&] { cuda::gemm_with_candidate(g, i); });
          if (t < best) best = t, best_i = i;
        }
        if (best_i >= 0)  // within a few percent is timing noise: candidate 0 is usually the step's own
          std::printf("  fastest: candidate %d of %d, %.1f TFLOP/s (%.2fx the step's call)\n", best_i,
                      cuda::gemm_candidates(g), flop / best / 1e9, ms / best);
        r.records.back()["best_candidate"] = best_i;
        r.records.back()["best_candidate_ms"] = best;
        r.save();
      }
    }
  }

  // ---- --fp8: the FP8 GEMMs at the same shapes (K-major operands, as the linears give
  // them) and the casts that feed them (issue 30: what the FP8 step's time is made of) ----
  const auto device_f32 = [](std::vector<float> h, Shape s) {
    OwnedTensor d(DType::F32, s, Device::CUDA);
    copy_tensor(d, Tensor{h.data(), DType::F32, Device::CPU, s});
    return d;
  };
  const auto table = [&](int64_t rows) {  // FP8 table rows, scale 1 (include/lns/core/fp8_linear.h)
    std::vector<float> t(size_t(rows * kFp8Fields), 0.0f);
    for (int64_t i = 0; i < rows; ++i) t[size_t(i * kFp8Fields + kFp8Scale)] = t[size_t(i * kFp8Fields + kFp8ScaleInv)] = 1;
    return device_f32(std::move(t), {rows, kFp8Fields});
  };
  // n E4M3 codes of operands as --fp8 casts them, KIND's values at a per-tensor scale that
  // puts their 4-sigma point at E4M3's 448 (about what the delayed scale keeps: amax near
  // the top of the range), in an f32 tensor (the backend has no byte dtype)
  static uint64_t coded = 0;
  const auto codes = [&](int64_t n, Operand kind) {
    const float std = kind == Operand::Weight ? 0.02f : 1.0f, scale = fp8_max(Fp8Format::E4M3) / (4 * std);
    std::vector<float> v(static_cast<size_t>(n));
    fill_normal(v.data(), n, 0.0f, std, rng_key(FLAGS_seed, "lns_bench_kernels.fp8." + std::to_string(coded++)));
    std::vector<uint8_t> h(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) h[size_t(i)] = f32_to_fp8(v[size_t(i)] * scale, Fp8Format::E4M3);
    const int64_t nwords = (n + 3) / 4;
    std::vector<float> words(static_cast<size_t>(nwords));
    std::memcpy(words.data(), h.data(), h.size());
    return device_f32(std::move(words), {nwords});
  };
  const auto ones = [&](int64_t n) { return device_f32(std::vector<float>(static_cast<size_t>(n), 1.0f), {n}); };
  const OwnedTensor rows = table(2);
  const float* one = static_cast<const float*>(rows.t.data) + kFp8ScaleInv;
  for (int64_t M : on("fp8") ? tokens : decltype(tokens){})
    for (const auto& [name, N, K] : gemms) {
      if (name == "lm_head" || N % 16 || K % 16) continue;  // bf16 under --fp8; FP8 needs multiples of 16
      const OwnedTensor a = codes(M * K, Operand::Activation), w = codes(N * K, Operand::Weight);
      OwnedTensor y(DType::BF16, Shape{M, N}, Device::CUDA);
      const std::string shape = std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
      const double flop = 2.0 * M * N * K;
      cuda::GemmArgs g;
      g.M = M, g.N = N, g.K = K, g.A = a.t.data, g.lda = K, g.B = w.t.data, g.ldb = K, g.trans_b = true;
      g.C = y.t.data, g.ldc = N, g.a_type = g.b_type = cuda::GemmInput::E4M3, g.a_scale = g.b_scale = one;
      double ms = time_ms([&] { cuda::gemm(g); });
      r.add("gemm_fp8_" + name + "_" + shape, "TFLOP/s", flop / ms / 1e9, ms, {M, N, K}, "flops", flop);
      // blockwise: x 1 x 128 (Vec128), w 128 x 128 (Block128), every factor 1
      const OwnedTensor sa = ones(cuda::gemm_scale_floats(cuda::GemmScale::Vec128, M, K)),
                        sb = ones(cuda::gemm_scale_floats(cuda::GemmScale::Block128, N, K));
      g.a_scale = static_cast<const float*>(sa.t.data), g.b_scale = static_cast<const float*>(sb.t.data);
      g.a_scale_mode = cuda::GemmScale::Vec128, g.b_scale_mode = cuda::GemmScale::Block128;
      ms = time_ms([&] { cuda::gemm(g); });
      r.add("gemm_fp8bw_" + name + "_" + shape, "TFLOP/s", flop / ms / 1e9, ms, {M, N, K}, "flops", flop);
    }
  for (auto [N, C] : on("fp8") ? norms : decltype(norms){}) {
    const OwnedTensor x = random_operand(DType::BF16, {N, C}, Operand::Activation, "fp8_cast x"), t = table(1);
    OwnedTensor q(DType::F32, Shape{(N * C + 3) / 4}, Device::CUDA), qT(DType::F32, Shape{(N * C + 3) / 4}, Device::CUDA),
        s(DType::F32, Shape{cuda::gemm_scale_floats(cuda::GemmScale::Vec128, std::max(N, C), std::max(N, C))},
          Device::CUDA);
    auto* row = static_cast<float*>(t.t.data);
    auto* q8 = static_cast<uint8_t*>(q.t.data);
    auto* qT8 = static_cast<uint8_t*>(qT.t.data);
    auto* sf = static_cast<float*>(s.t.data);
    const std::string shape = std::to_string(N) + "x" + std::to_string(C);
    const double b3 = 3.0 * N * C, b4 = 4.0 * N * C;
    double ms = time_ms([&] { cuda::fp8_cast(x, row, Fp8Format::E4M3, true, q8, nullptr); });
    r.add("fp8_cast_" + shape, "GB/s", b3 / ms / 1e6, ms, {N, C}, "bytes", b3);
    ms = time_ms([&] { cuda::fp8_cast(x, row, Fp8Format::E4M3, true, q8, qT8); });
    r.add("fp8_cast_t_" + shape, "GB/s", b4 / ms / 1e6, ms, {N, C}, "bytes", b4);
    ms = time_ms([&] { cuda::fp8_cast_tiles_rows(x, row, Fp8Format::E4M3, true, q8, sf); });
    r.add("fp8_tiles_rows_" + shape, "GB/s", b3 / ms / 1e6, ms, {N, C}, "bytes", b3);
    ms = time_ms([&] { cuda::fp8_cast_tiles_cols(x, Fp8Format::E4M3, qT8, sf); });
    r.add("fp8_tiles_cols_" + shape, "GB/s", b3 / ms / 1e6, ms, {N, C}, "bytes", b3);
  }

  // ---- causal attention: fused, cuDNN's (where its library loads; its deterministic and
  // its atomic backward) and materialised -------------------------------------------------
  const int64_t D = cfg.head_dim(), Hq = cfg.num_heads, Hkv = cfg.num_kv_heads;
  bool cudnn = on("attention") && cudnn_attention_takes(D);
  if (cudnn) try {
      std::printf("attention_cudnn: %s\n", attention_library(AttentionImpl::Cudnn).c_str());
    } catch (const UserError& e) {
      std::printf("attention_cudnn: not measured: %s\n", e.what());
      cudnn = false;
    }
  std::vector<std::pair<int64_t, int64_t>> attention_shapes;
  if (on("attention")) attention_shapes.push_back({FLAGS_micro_batch_size, FLAGS_seq_len});
  if (on("attention") && FLAGS_long_seq > 0) attention_shapes.push_back({1, FLAGS_long_seq});
  for (auto [B, T] : attention_shapes)
    for (AttentionImpl impl : {AttentionImpl::Fused, AttentionImpl::Cudnn, AttentionImpl::CudnnNondeterministic,
                               AttentionImpl::Materialized}) {
      if (impl == AttentionImpl::Fused && !fused_attention_takes(D)) continue;
      if (is_cudnn(impl) && !cudnn) continue;
      const Shape qs{B, T, Hq, D}, ks{B, T, Hkv, D};
      // q and k at unit RMS: scores q.k / sqrt(D) of unit variance, a softmax neither flat
      // nor one-hot, as in a trained model's attention
      OwnedTensor q = random_operand(DType::BF16, qs, Operand::Activation, "attention q"),
                  k = random_operand(DType::BF16, ks, Operand::Activation, "attention k"),
                  v = random_operand(DType::BF16, ks, Operand::Activation, "attention v"),
                  out(DType::BF16, qs, Device::CUDA),
                  dout = random_operand(DType::BF16, qs, Operand::Activation, "attention dout"),
                  dq(DType::BF16, qs, Device::CUDA),
                  dk(DType::BF16, ks, Device::CUDA), dv(DType::BF16, ks, Device::CUDA),
                  saved(DType::F32, attention_saved_shape(Device::CUDA, B, T, Hq), Device::CUDA);
      const std::string name = std::string("attention_") + attention_impl_name(impl) + "_";
      const std::string shape = std::to_string(B) + "x" + std::to_string(T) + "x" + std::to_string(Hq) + "x" +
                                std::to_string(Hkv) + "x" + std::to_string(D);
      const double flop = 2.0 * B * Hq * T * T * D;  // 4 B Hq D T^2 / 2: two products, causal half
      double ms = time_ms([&] { attention_forward(out, saved, q, k, v, impl); });
      r.add(name + "fwd_" + shape, "TFLOP/s", flop / ms / 1e9, ms, {B, T, Hq, Hkv, D}, "flops", flop);
      ms = time_ms([&] { attention_backward(dq, dk, dv, dout, saved, q, k, v, out, impl); });
      r.add(name + "bwd_" + shape, "TFLOP/s", 2.5 * flop / ms / 1e9, ms, {B, T, Hq, Hkv, D}, "flops", 2.5 * flop);
    }

  r.save();  // a run with no figure still writes its (empty) file
  return 0;
}

}  // namespace
}  // namespace lns

int main(int argc, char** argv) {
  lns::line_buffered_stdout();
  gflags::SetUsageMessage("lns_bench_kernels [--json=PATH] [--flagfile=configs/1b_lns.flags]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  try {
    return lns::run();
  } catch (const lns::UserError& e) {
    std::fprintf(stderr, "lns_bench_kernels: error: %s\n", e.what());
    return 1;
  }
}
