// lns_train as a user runs it: bad input is one clear stderr line and a non-zero
// exit; --init_from + --dump_step_state write exactly what the library computes.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "lns/data/data.h"
#include "lns/core/device.h"
#include "lns/train/trainer.h"
#include "lns/checkpoint/param_io.h"
#include "lns/model/stage.h"
#include "test_util.h"

namespace lns {
namespace {

using namespace lns::test;

struct Result {
  int code;
  std::string err;
};

Result run_binary(const std::string& binary, const std::string& args) {
  static int calls = 0;  // unique per process and call: ctest runs tests in parallel
  const std::string err_path = ::testing::TempDir() + "/lns_cli_stderr_" +
                               std::to_string(::getpid()) + "_" + std::to_string(calls++) + ".txt";
  const std::string cmd = binary + " " + args + " >/dev/null 2>" + err_path;
  const int status = std::system(cmd.c_str());
  std::ifstream f(err_path);
  std::stringstream ss;
  ss << f.rdbuf();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ss.str()};
}

Result run_train(const std::string& args) { return run_binary(LNS_TRAIN_BIN, args); }

std::string golden(const std::string& name) {
  return std::string(LNS_SOURCE_DIR) + "/tests/golden/" + name + ".safetensors";
}

// The flags of the golden files' model (tools/reference/make_golden.py).
const std::string kGoldenFlags =
    "--vocab_size=53 --hidden_size=36 --intermediate_size=45 --num_layers=3 --num_heads=6 "
    "--num_kv_heads=2 --post_layers=1 --seq_len=7 --micro_batch_size=2 --global_batch_size=2";

void expect_one_line_error(const std::string& args, const std::string& needle,
                           const std::string& binary = LNS_TRAIN_BIN) {
  const Result r = run_binary(binary, args);
  EXPECT_NE(r.code, 0) << args;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err;
  // The error is one line, the last one; log lines before it are fine.
  std::string body = r.err;
  while (!body.empty() && body.back() == '\n') body.pop_back();
  const std::string last = body.substr(body.rfind('\n') == std::string::npos ? 0 : body.rfind('\n') + 1);
  EXPECT_NE(last.find(needle), std::string::npos) << "the last line should carry the error: " << r.err;
  EXPECT_EQ(r.err.find("Check failed"), std::string::npos) << r.err;
}

TEST(Cli, BadInputIsOneClearLine) {
  expect_one_line_error("--norm_scheme=prenorm",
                        "--norm_scheme=prenorm is not a normalization scheme; expected one of pre");
  expect_one_line_error("--hidden_size=36 --num_heads=5 --num_kv_heads=5",
                        "--hidden_size=36 must be divisible by --num_heads=5");
  expect_one_line_error("--hidden_size=36 --num_heads=6 --num_kv_heads=4",
                        "--num_heads=6 must be divisible by --num_kv_heads=4");
  expect_one_line_error("--norm_type=batchnorm", "--norm_type=batchnorm is not a norm type");
  expect_one_line_error("--norm_schem=lns", "unknown command line flag 'norm_schem'");
  expect_one_line_error(kGoldenFlags + " --init_from=/nonexistent/w.safetensors",
                        "/nonexistent/w.safetensors: cannot open");
  // A safetensors file with a wrong shape for this model.
  expect_one_line_error(
      kGoldenFlags + " --norm_scheme=mix --intermediate_size=44 --init_from=" + golden("rmsnorm_mix"),
      "'model.layers.0.mlp.gate_proj.weight' has shape [45, 36], expected [44, 36]");
}

// --device=cuda without a usable GPU (this build has no CUDA, or the machine no GPU)
// is one line naming the flag, not a crash in the first kernel.
TEST(Cli, DeviceAndCommAreChecked) {
  expect_one_line_error("--device=gpu", "--device must be cpu or cuda, got 'gpu'");
  if (cuda_device_count() == 0) expect_one_line_error("--device=cuda --steps=1", "--device=cuda: ");
}

TEST(Cli, BadDataAndBatchesAreOneClearLine) {
  const std::string dir = ::testing::TempDir() + "/lns_cli_data_" + std::to_string(::getpid());
  std::system(("mkdir -p " + dir).c_str());
  const std::string small = kGoldenFlags + " --norm_scheme=lns --steps=1";
  expect_one_line_error(small + " --data=" + dir + "/nope.tok", dir + "/nope.tok: data file not found");
  // A corrupt header: right magic, impossible token width.
  std::string bytes = "LNSTOKEN";
  bytes += std::string("\x01\0\0\0\x07\0\0\0", 8) + std::string(48, '\0');
  std::ofstream(dir + "/corrupt.tok", std::ios::binary) << bytes;
  expect_one_line_error(small + " --data=" + dir + "/corrupt.tok",
                        "corrupt header (token width 7 bytes, expected 2 or 4)");
  // A token id outside the model's vocabulary (53).
  std::vector<int32_t> toks(40, 3);
  toks[17] = 60;
  write_token_file(dir + "/oov.tok", toks, {0, 40}, 2, 0);
  expect_one_line_error(small + " --global_batch_size=8 --data=" + dir + "/oov.tok",  // every sample
                        "token id 60 at position 17 is outside the model's vocabulary");
  expect_one_line_error(small + " --global_batch_size=5 --micro_batch_size=2",
                        "--global_batch_size=5 must be a multiple of --micro_batch_size=2");
  expect_one_line_error(small + " --data_mode=sliding", "--data_mode=sliding is not a sampling mode");
}

// --fp8: bad settings are one line naming the flag; a run logs each linear's FP8 health
// and writes it per layer and tensor to metrics.jsonl.
TEST(Cli, Fp8FlagsAndHealthRecords) {
  const std::string small = kGoldenFlags + " --norm_scheme=lns --steps=1";
  expect_one_line_error(small + " --fp8=e4m3", "--fp8=e4m3: expected none, delayed or blockwise");
  expect_one_line_error(small + " --fp8=delayed --fp8_amax_history=0", "--fp8_amax_history=0: expected 1 to 1048576");
  expect_one_line_error(small + " --fp8=delayed --fp8_margin=-1", "--fp8_margin=-1: expected 0 to 64");
  expect_one_line_error(small + " --fp8=delayed --fp8_amax_compute=mean", "--fp8_amax_compute=mean: expected max or most_recent");
  const std::string dir = ::testing::TempDir() + "/lns_cli_fp8_" + std::to_string(::getpid());
  std::system(("rm -rf " + dir).c_str());
  const Result r = run_train(kGoldenFlags + " --norm_scheme=lns --steps=3 --log_every=1 --fp8=delayed --out_dir=" + dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("fp8 step 3: most saturated"), std::string::npos) << r.err;
  std::ifstream m(dir + "/metrics.jsonl");
  std::string line;
  int records = 0;
  while (std::getline(m, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("fp8")) continue;
    ++records;
    ASSERT_EQ(j["fp8"].size(), 3u * 7 * 3) << "3 layers x 7 linears x (x, w, dy)";
    const nlohmann::json& first = j["fp8"][0];
    EXPECT_EQ(first["layer"], 0);
    EXPECT_EQ(first["linear"], "q_proj");
    EXPECT_EQ(first["tensor"], "x");
    EXPECT_GT(first["amax"].get<double>(), 0);
    EXPECT_GE(first["saturated"].get<double>(), 0);
  }
  EXPECT_EQ(records, 3);
  // The scaling state is in the checkpoint: resuming with other settings is one line.
  expect_one_line_error(kGoldenFlags + " --norm_scheme=lns --steps=4 --fp8=delayed --fp8_margin=1 --resume=auto --out_dir=" + dir,
                        "the checkpoint's FP8 scaling is --fp8=delayed --fp8_amax_history=1024 --fp8_margin=0 "
                        "--fp8_amax_compute=max; pass the same to resume");
  // --fp8=blockwise runs on the CPU, logs its health (nothing saturates), and resumes.
  const std::string bdir = dir + "_blockwise";
  std::system(("rm -rf " + bdir).c_str());
  const Result b = run_train(kGoldenFlags + " --norm_scheme=lns --steps=2 --log_every=1 --fp8=blockwise --out_dir=" + bdir);
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_NE(b.err.find("fp8 step 2: most saturated 0%"), std::string::npos) << b.err;
  const Result br = run_train(kGoldenFlags + " --norm_scheme=lns --steps=3 --fp8=blockwise --resume=auto --out_dir=" + bdir);
  EXPECT_EQ(br.code, 0) << br.err;
}

TEST(Cli, EvalBadInputIsOneClearLine) {
  // A 3-layer checkpoint (vocabulary 53) and token files that do not fit it.
  const std::string dir = ::testing::TempDir() + "/lns_cli_eval_" + std::to_string(::getpid());
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  LlamaConfig c;
  c.vocab_size = 53, c.hidden_size = 16, c.intermediate_size = 24, c.num_layers = 3;
  c.num_heads = 2, c.num_kv_heads = 1;
  TrainConfig t;
  t.seq_len = 4, t.micro_batch = 2, t.global_batch = 2, t.steps = 1, t.out_dir = dir + "/run";
  Trainer tr(c, t);
  tr.train_step();
  const std::string ck = tr.save_checkpoint();
  std::vector<int32_t> ok(64, 5);
  write_token_file(dir + "/ok.tok", ok, {0, 64}, 2, 53);
  write_token_file(dir + "/big.tok", ok, {0, 64}, 2, 32000);
  const std::string base = "--checkpoint=" + ck + " --seq_len=4 --micro_batch_size=2 --eval_tokens=16 ";
  expect_one_line_error(base + "--data=" + dir + "/ok.tok --drop_layers=1,3",
                        "--drop_layers=1,3: layer '3' is not in [0, 3)", LNS_EVAL_BIN);
  expect_one_line_error(base + "--data=" + dir + "/big.tok",
                        "was tokenized with a vocabulary of 32000 tokens, larger than the model's 53", LNS_EVAL_BIN);
  expect_one_line_error(base + "--hf_dir=/x --data=" + dir + "/ok.tok",
                        "give exactly one of --checkpoint and --hf_dir", LNS_EVAL_BIN);
  expect_one_line_error("--checkpoint=" + dir + "/none --data=" + dir + "/ok.tok",
                        dir + "/none/manifest.json: missing", LNS_EVAL_BIN);
  expect_one_line_error(base + "--data=" + dir + "/ok.tok --device=tpu", "--device must be cpu or cuda, got 'tpu'",
                        LNS_EVAL_BIN);
  if (cuda_device_count() == 0)
    expect_one_line_error(base + "--data=" + dir + "/ok.tok --device=cuda", "--device=cuda: ", LNS_EVAL_BIN);
  // And the happy path: one line of perplexity over exactly the requested tokens.
  const Result r = run_binary(LNS_EVAL_BIN, base + "--data=" + dir + "/ok.tok --out=" + dir + "/ev");
  EXPECT_EQ(r.code, 0) << r.err;
  std::ifstream j(dir + "/ev.json");
  const auto json = nlohmann::json::parse(j);
  EXPECT_EQ(json["tokens"], 16);
  EXPECT_NEAR(json["ppl"].get<double>(), std::exp(json["loss"].get<double>()), 1e-9);
}

TEST(Cli, DumpStepStateEqualsTheLibrary) {
  const std::string dump =
      ::testing::TempDir() + "/lns_cli_dump_" + std::to_string(::getpid()) + ".safetensors";
  std::remove(dump.c_str());
  const Result r = run_train(kGoldenFlags + " --norm_scheme=mix --seed=5 --init_from=" +
                             golden("rmsnorm_mix") + " --dump_step_state=" + dump);
  ASSERT_EQ(r.code, 0) << r.err;

  SafetensorsReader d(dump);
  EXPECT_EQ(d.metadata().at("format"), "lns-step-state-v1");
  const LlamaConfig cfg = LlamaConfig::from_json(nlohmann::json::parse(d.metadata().at("config")), dump);
  EXPECT_EQ(cfg.norm_scheme, NormScheme::Mix);
  EXPECT_EQ(cfg.post_layers, 1);
  auto inputs = d.read_i32("inputs"), targets = d.read_i32("targets");
  ASSERT_EQ(d.entry("inputs").shape, (std::vector<int64_t>{2, 7}));
  for (int b = 0; b < 2; ++b)  // --data=random: targets are the inputs shifted by one
    for (int t = 0; t + 1 < 7; ++t) EXPECT_EQ(targets[b * 7 + t], inputs[b * 7 + t + 1]);

  LlamaStage model(cfg, StageSpec::whole(cfg), 2, 7);
  load_params(model.params(), SafetensorsReader(golden("rmsnorm_mix")), model.config());
  const Tensor logits = model.forward(view(inputs, {2, 7}));
  EXPECT_EQ(std::vector<float>(logits.f32(), logits.f32() + logits.numel()), d.read_f32("logits"));
  const float loss = static_cast<float>(model.loss(view(targets, {14})) / 14);
  EXPECT_EQ(d.read_f32("loss")[0], loss);
  model.params().zero_grads();
  model.backward({}, 1.0f / 14);
  for (int i = 0; i < model.params().size(); ++i) {
    const Tensor g = model.params().grad(i);
    EXPECT_EQ(std::vector<float>(g.f32(), g.f32() + g.numel()),
              d.read_f32("grad." + model.params().info(i).name))
        << model.params().info(i).name;
  }
}

}  // namespace
}  // namespace lns
