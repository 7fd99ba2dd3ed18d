// Every flagfile in configs/ parses, validates, and has the shape and schedule the
// paper (or the quickstart) specifies.
#include <gflags/gflags.h>

#include "lns/model/activation_memory.h"
#include "lns/model/model_flags.h"
#include "lns/train/train_flags.h"
#include "test_util.h"

namespace lns {
namespace {

struct Expect {
  const char* name;
  int hidden, layers, heads, inter, vocab;
  int64_t steps, warmup;
  double lr;
};

TEST(Configs, FlagfilesHaveThePapersShapes) {
  const Expect sizes[] = {
      {"130m", 768, 12, 12, 2048, 32000, 20000, 2000, 1e-3},
      {"250m", 768, 24, 16, 2560, 32000, 40000, 4000, 1e-3},
      {"350m", 1024, 24, 16, 2736, 32000, 60000, 6000, 5e-4},
      {"1b", 2048, 24, 32, 5461, 32000, 100000, 1000, 5e-4},
      {"tiny", 128, 6, 4, 344, 257, 300, 30, 3e-3},
  };
  for (const Expect& e : sizes)
    for (const char* scheme : {"lns", "pre"}) {
      gflags::FlagSaver restore;  // flags are global: leave them as found
      const std::string path = std::string(LNS_SOURCE_DIR) + "/configs/" + e.name + "_" + scheme + ".flags";
      ASSERT_TRUE(gflags::ReadFromFlagsFile(path, "lns_tests", true)) << path;
      const LlamaConfig m = config_from_flags();
      const TrainConfig t = train_config_from_flags();
      SCOPED_TRACE(path);
      EXPECT_EQ(m.norm_scheme, std::string(scheme) == "lns" ? NormScheme::LNS : NormScheme::Pre);
      EXPECT_EQ(m.hidden_size, e.hidden);
      EXPECT_EQ(m.num_layers, e.layers);
      EXPECT_EQ(m.num_heads, e.heads);
      EXPECT_EQ(m.intermediate_size, e.inter);
      EXPECT_EQ(m.vocab_size, e.vocab);
      EXPECT_EQ(t.steps, e.steps);
      EXPECT_EQ(t.warmup_steps, e.warmup);
      EXPECT_DOUBLE_EQ(t.lr, e.lr);
      EXPECT_DOUBLE_EQ(t.min_lr_ratio, 0.1);
      if (std::string(e.name) != "tiny") {
        EXPECT_EQ(t.seq_len, 256);
        EXPECT_EQ(t.global_batch, 512);
        EXPECT_EQ(t.adam.weight_decay, 0.0f);
        EXPECT_EQ(t.data_mode, SampleMode::Document);
        EXPECT_EQ(t.device, Device::CUDA);  // the paper's sizes are GPU runs
      } else {
        EXPECT_EQ(t.device, Device::CPU);  // the quickstart runs anywhere
      }
    }
}

// The long-sequence variant: the 1b LNS model, the same tokens per step, T = 4096,
// the fused attention.
TEST(Configs, OneBillionAtSequence4096) {
  gflags::FlagSaver restore;
  const std::string path = std::string(LNS_SOURCE_DIR) + "/configs/1b_lns_seq4k.flags";
  ASSERT_TRUE(gflags::ReadFromFlagsFile(path, "lns_tests", true)) << path;
  const LlamaConfig m = config_from_flags();
  const TrainConfig t = train_config_from_flags();
  EXPECT_EQ(m.hidden_size, 2048);
  EXPECT_EQ(m.num_layers, 24);
  EXPECT_EQ(m.norm_scheme, NormScheme::LNS);
  EXPECT_EQ(m.attention, AttentionImpl::Fused);
  EXPECT_TRUE(fused_attention_takes(m.head_dim()));
  EXPECT_EQ(t.seq_len, 4096);
  EXPECT_EQ(int64_t{t.seq_len} * t.global_batch, 256 * 512);
  EXPECT_EQ(t.device, Device::CUDA);
}

// The LLaMA-2 7B and 13B shapes, with the layout, recomputation and micro-batch of
// tools/perf/memory_model.py (tests/python/test_memory_model.py checks that the files
// hold its choice). The activation account of the chosen layout's rank, by hand:
// per layer u, f, r of both sublayers [N,C], q k v ctx [N, C/tp], gate up act
// [N, F/tp] in bf16, the log-sum-exp [B, H/tp, T] and two rstd [N] in f32.
TEST(Configs, LlamaTwoSevenAndThirteenBillion) {
  struct Big {
    const char* name;
    int hidden, layers, heads, inter, tp;
  };
  for (const Big& e : {Big{"7b", 4096, 32, 32, 11008, 2}, Big{"13b", 5120, 40, 40, 13824, 4}}) {
    gflags::FlagSaver restore;
    const std::string path = std::string(LNS_SOURCE_DIR) + "/configs/" + e.name + "_lns.flags";
    ASSERT_TRUE(gflags::ReadFromFlagsFile(path, "lns_tests", true)) << path;
    SCOPED_TRACE(path);
    const LlamaConfig m = config_from_flags();
    const TrainConfig t = train_config_from_flags();
    EXPECT_EQ(m.hidden_size, e.hidden);
    EXPECT_EQ(m.num_layers, e.layers);
    EXPECT_EQ(m.num_heads, e.heads);
    EXPECT_EQ(m.num_kv_heads, e.heads);
    EXPECT_EQ(m.intermediate_size, e.inter);
    EXPECT_EQ(m.vocab_size, 32000);
    EXPECT_EQ(m.norm_scheme, NormScheme::LNS);
    EXPECT_EQ(t.seq_len, 4096);
    EXPECT_EQ(t.global_batch, 1024);
    EXPECT_EQ(t.device, Device::CUDA);
    EXPECT_TRUE(t.zero);
    ASSERT_EQ(tp_flag(), e.tp);
    ASSERT_EQ(pp_flag(), 1);
    EXPECT_EQ(m.recompute, RecomputeMode::None);
    ASSERT_EQ(t.micro_batch, 1);
    const int64_t N = 4096, C = e.hidden, F = e.inter / e.tp, H = e.heads / e.tp;
    const ActivationAccount acc = activation_account(m, StageSpec::whole(m), 1, 4096, 1,
                                                     TensorParallel{0, e.tp, nullptr}, Device::CUDA);
    const int64_t layer = 2 * (6 * N * C + 4 * N * C / e.tp + 3 * N * F) + 4 * (H * 4096 + 2 * N);
    EXPECT_EQ(acc.layers.at(0).kept_bytes, layer);
    // selective drops ctx, the log-sum-exp and act: about 13% of a layer here
    LlamaConfig sel = m;
    sel.recompute = RecomputeMode::Selective;
    const ActivationAccount s = activation_account(sel, StageSpec::whole(m), 1, 4096, 1,
                                                   TensorParallel{0, e.tp, nullptr}, Device::CUDA);
    EXPECT_EQ(s.layers.at(0).kept_bytes, layer - 2 * (N * C / e.tp + N * F) - 4 * H * 4096);
  }
}

}  // namespace
}  // namespace lns
