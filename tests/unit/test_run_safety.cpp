// Training state and evaluation that cannot mislead: a non-finite state is never
// saved and never becomes `latest`; nonsensical numeric flags are refused; lns_eval
// refuses non-finite weights or perplexity, never reads data twice, evaluates at the
// length the checkpoint was trained at, and checks --out before evaluating.
#include <cmath>
#include <filesystem>

#include "lns/checkpoint/checkpoint.h"
#include "lns/data/data.h"
#include "lns/train/trainer.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace lns {
namespace {

using namespace lns::test;

TrainConfig small_run(const std::string& out) {
  TrainConfig t;
  t.data = "random", t.seq_len = 8, t.micro_batch = 2, t.global_batch = 4, t.steps = 5;
  t.out_dir = out;
  return t;
}

TEST(TrainSafety, NonFiniteStateIsNeverSaved) {
  const std::string out = fresh_test_dir("nonfinite") + "/run";
  Trainer tr(small_model(NormScheme::LNS), small_run(out));
  tr.train_step();
  tr.train_step();
  const std::string good = tr.save_checkpoint();
  tr.train_step();
  const auto before = snapshot(out);
  ParamSet& ps = tr.model().params();
  const int i = ps.find("model.norm.weight");
  ps.host_param(i).f32()[3] = NAN;  // on the CPU the host copy is the weight
  EXPECT_EQ(error_of([&] { tr.save_checkpoint(); }),
            "step 3 left non-finite training state (weight 'model.norm.weight' holds inf or NaN); nothing was "
            "saved and checkpoints/latest still names the last good checkpoint. Likely cause: --lr=0.001 too "
            "large for this model, or data that drives the loss to extremes");
  ps.host_param(i).f32()[3] = 1.0f;
  tr.optimizer().exp_avg_sq().f32()[7] = INFINITY;
  EXPECT_NE(error_of([&] { tr.save_checkpoint(); }).find("(AdamW moments holds inf or NaN)"), std::string::npos);
  EXPECT_EQ(snapshot(out), before);  // no step_0000003, no .tmp, latest unchanged
  EXPECT_EQ(find_latest_checkpoint(out), good);
}

void expect_one_line(const RunResult& r, const std::string& needle) {
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.last_line().find(needle), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
}

const std::string kModel = "--vocab_size=53 --hidden_size=32 --intermediate_size=45 --num_layers=2 --num_heads=4 "
                           "--num_kv_heads=2 --seq_len=8 --micro_batch_size=2 --global_batch_size=4 --steps=1";

TEST(TrainSafety, NonsenseNumbersAreRefused) {
  const std::string dir = fresh_test_dir("nonsense");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--lr=inf", "--lr must be a positive number that f32 can hold, got inf"},
      {"--lr=nan", "--lr must be a positive number that f32 can hold, got nan"},
      {"--lr=1e39", "--lr must be a positive number that f32 can hold, got 1e+39"},
      {"--lr=-1", "--lr must be a positive number"},
      {"--adam_eps=0", "--adam_eps must be a positive number that f32 can hold (>= 1.4e-45), got 0"},
      {"--adam_eps=1e-50", "--adam_eps must be a positive number that f32 can hold"},
      {"--adam_eps=inf", "--adam_eps must be a positive number"},
      {"--weight_decay=-0.1", "--weight_decay must be >= 0, got -0.1"},
      {"--weight_decay=nan", "--weight_decay must be >= 0, got nan"},
      {"--diag_every=-1", "--diag_every must be >= 0 (0 = off), got -1"},
      {"--grad_clip=nan", "--grad_clip must be >= 0 (0 = off), got nan"},
      {"--grad_clip=inf", "--grad_clip must be >= 0"},
      {"--beta1=nan", "--beta1 must be in [0, 1), got nan"},
      {"--beta2=1", "--beta2 must be in [0, 1), got 1"},
      {"--min_lr_ratio=nan", "--min_lr_ratio must be in [0, 1]"},
      {"--dp_bucket_mb=inf", "--dp_bucket_mb must be in (0, 1048576], got inf"},
      {"--peak_tflops=-1", "--peak_tflops must be >= 0"},
      {"--save_every=2", "--save_every=2 needs --out_dir (where the checkpoints go)"},
      {"--keep_checkpoints=2", "--keep_checkpoints needs --out_dir"},
      {"--norm_eps=0", "--norm_eps must be positive"},
      {"--rope_theta=nan", "--rope_theta must be positive"},
      {"--vocab_size=2000000000", "--vocab_size=2000000000 is larger than the supported 16777216"},
      {"--intermediate_size=16000000 --hidden_size=16384 --num_heads=128 --num_kv_heads=128",
       "an MLP matrix (--intermediate_size x --hidden_size) has 16000000 x 16384 elements"},
  };
  for (const auto& [flags, needle] : cases) expect_one_line(run_binary(LNS_TRAIN_BIN, kModel + " " + flags), needle);
  // The reproducers with a run directory: refused before anything is written.
  for (const char* flags : {"--lr=inf", "--adam_eps=0"}) {
    const RunResult r = run_binary(LNS_TRAIN_BIN, kModel + " " + flags + " --out_dir=" + dir + "/run");
    EXPECT_EQ(r.code, 1);
    EXPECT_FALSE(fs::exists(dir + "/run/checkpoints"));
    EXPECT_FALSE(fs::exists(dir + "/run/config.flags"));
  }
}

// A source that serves another source's tensors, one of them scaled (or poisoned).
struct Scaled : TensorSource {
  const TensorSource& src;
  std::string name;
  float scale;
  Scaled(const TensorSource& s, std::string n, float k) : src(s), name(std::move(n)), scale(k) {}
  bool has(const std::string& n, const std::string& k) const override { return src.has(n, k); }
  std::vector<float> logical(const std::string& n, const std::string& k) const override {
    std::vector<float> v = src.logical(n, k);
    if (n == name && k == "param") {
      for (float& x : v) x *= scale;
      if (std::isnan(scale)) v.assign(v.size(), NAN);
    }
    return v;
  }
  std::vector<int64_t> logical_shape(const std::string& n) const override { return src.logical_shape(n); }
  std::string where() const override { return src.where(); }
};

struct EvalFixture {
  std::string dir, ck, data;
};

const EvalFixture& eval_fixture() {
  static const EvalFixture f = [] {
    EvalFixture x;
    x.dir = fresh_test_dir("eval_safety");
    Trainer tr(small_model(NormScheme::LNS), small_run(x.dir + "/run"));
    tr.train_step();
    x.ck = tr.save_checkpoint();
    std::vector<int32_t> toks;
    for (int i = 0; i < 600; ++i) toks.push_back((i * 7) % 53);
    x.data = x.dir + "/val.tok";
    write_token_file(x.data, toks, {0, 600}, 2, 53);
    return x;
  }();
  return f;
}

TEST(EvalSafety, NonFiniteWeightsOrPerplexityAreErrors) {
  const EvalFixture& f = eval_fixture();
  const Checkpoint ck(f.ck);
  const std::string nan_ck = f.dir + "/nan", huge_ck = f.dir + "/huge";
  fs::remove_all(nan_ck);
  fs::remove_all(huge_ck);
  write_checkpoint_from_source(Scaled(ck, "model.layers.1.self_attn.o_proj.weight", NAN), ck.config(), {}, "",
                               ck.run_state(), ck.info().optimizer->adam, 1, nan_ck);
  write_checkpoint_from_source(Scaled(ck, "lm_head.weight", 1e30f), ck.config(), {}, "", ck.run_state(),
                               ck.info().optimizer->adam, 1, huge_ck);
  expect_one_line(run_binary(LNS_EVAL_BIN, "--checkpoint=" + nan_ck + " --data=" + f.data),
                  "lns_eval: error: " + nan_ck + "/manifest.json: weight 'model.layers.1.self_attn.o_proj.weight' "
                  "holds inf or NaN; this model cannot be evaluated");
  expect_one_line(run_binary(LNS_EVAL_BIN, "--checkpoint=" + huge_ck + " --data=" + f.data),
                  "the perplexity on " + f.data + " is not finite");
  // The same checkpoint's untouched weights evaluate fine.
  EXPECT_EQ(run_binary(LNS_EVAL_BIN, "--checkpoint=" + f.ck + " --data=" + f.data).code, 0);
}

TEST(EvalSafety, LengthDataAndOutput) {
  const EvalFixture& f = eval_fixture();
  const std::string base = "--checkpoint=" + f.ck + " --data=" + f.data + " --out=" + f.dir + "/ev";
  // Default: the length the checkpoint was trained at (8), not the flag's 256.
  RunResult r = run_binary(LNS_EVAL_BIN, base + " --eval_tokens=40");
  ASSERT_EQ(r.code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(slurp(f.dir + "/ev.json"));
  EXPECT_EQ(j["seq_len"], 8);
  EXPECT_EQ(j["tokens"], 40);
  EXPECT_NE(r.out.find("at --seq_len=8"), std::string::npos) << r.out;
  // Beyond the trained length: evaluated as asked, with a warning.
  r = run_binary(LNS_EVAL_BIN, base + " --eval_tokens=40 --seq_len=16");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("lns_eval: warning: --seq_len=16 is longer than the 8 the checkpoint was trained at"),
            std::string::npos) << r.err;
  EXPECT_EQ(nlohmann::json::parse(slurp(f.dir + "/ev.json"))["seq_len"], 16);
  // More tokens than the data holds: all of it, once. 600 tokens = 74 packed samples
  // of 8 targets = 592 positions.
  r = run_binary(LNS_EVAL_BIN, base + " --eval_tokens=100000000");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("--eval_tokens=100000000 is more than " + f.data + " holds; evaluating all of it once: 592 "
                       "target positions"), std::string::npos) << r.err;
  EXPECT_EQ(nlohmann::json::parse(slurp(f.dir + "/ev.json"))["tokens"], 592);
  // --out where nothing can be written: one line, before any evaluation.
  spit(f.dir + "/file", "x");
  r = run_binary(LNS_EVAL_BIN, "--checkpoint=" + f.ck + " --data=" + f.data + " --out=" + f.dir + "/file/ev");
  expect_one_line(r, "lns_eval: error: --out=" + f.dir + "/file/ev: cannot create " + f.dir + "/file: Not a directory");
  // An older checkpoint without the training record: the flag, with a warning.
  nlohmann::json m = nlohmann::json::parse(slurp(f.ck + "/manifest.json"));
  m.erase("training");
  m["manifest_crc32"] = manifest_crc(m);
  const std::string old = f.dir + "/old";
  fs::remove_all(old);
  fs::copy(f.ck, old);
  spit(old + "/manifest.json", m.dump());
  r = run_binary(LNS_EVAL_BIN, "--checkpoint=" + old + " --data=" + f.data + " --eval_tokens=16");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("does not record the sequence length it was trained at"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("at --seq_len=256"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace lns
