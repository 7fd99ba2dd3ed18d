// Weighted blends as lns_train runs them (issue 48): bad weights are one line naming the
// flag; the step records count each source's samples; a blended --val_data reports
// each source's loss, equal to a run that validates on that source alone.
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lns/data/data.h"
#include "test_util.h"

namespace lns {
namespace {

using namespace lns::test;

// The model of the golden files, tiny and fast (tools/reference/make_golden.py).
const std::string kModel =
    "--vocab_size=53 --hidden_size=36 --intermediate_size=45 --num_layers=3 --num_heads=6 "
    "--num_kv_heads=2 --post_layers=1 --seq_len=7 --micro_batch_size=2 --global_batch_size=4 --log_every=1";

std::string corpus(const std::string& dir, const std::string& name, int mul) {
  std::vector<int32_t> toks;
  std::vector<int64_t> docs = {0};
  for (int d = 0; d < 60; ++d) {
    for (int i = 0; i < 4 + d % 9; ++i) toks.push_back((d * mul + i * 5) % 53);
    docs.push_back(static_cast<int64_t>(toks.size()));
  }
  write_token_file(dir + "/" + name, toks, docs, 2, 53);
  return dir + "/" + name;
}

std::vector<nlohmann::json> records(const std::string& out_dir) {
  std::vector<nlohmann::json> rows;
  std::ifstream f(out_dir + "/metrics.jsonl");
  for (std::string line; std::getline(f, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

void expect_one_line_error(const std::string& args, const std::string& needle) {
  const RunResult r = run_binary(LNS_TRAIN_BIN, args);
  EXPECT_NE(r.code, 0) << args;
  EXPECT_NE(r.last_line().find(needle), std::string::npos) << args << "\nstderr: " << r.err;
  EXPECT_EQ(r.err.find("Check failed"), std::string::npos) << r.err;
}

TEST(BlendRun, BadWeightsAreOneLineNamingTheFlag) {
  const std::string dir = fresh_test_dir("blend_bad");
  const std::string a = corpus(dir, "a.tok", 7), b = corpus(dir, "b.tok", 11);
  const std::string run = kModel + " --steps=1 ";
  expect_one_line_error(run + "--data=x:" + a + ",0.3:" + b, "--data: the weight 'x' of source 1 is not a number");
  expect_one_line_error(run + "--data=0.7:" + a + ",-0.3:" + b, "--data: the weight -0.3 of source 2 (" + b + ") is negative");
  expect_one_line_error(run + "--data=0:" + a + ",0:" + b, "--data: the weight 0 of source 1 (" + a + ") is zero");
  expect_one_line_error(run + "--data=0.5:,0.5:" + b, "--data: source 1 has the weight 0.5 but no path");
  expect_one_line_error(run + "--data=1:" + a + ",1:" + dir + "/nope.tok",
                        "--data source 2 of 2: " + dir + "/nope.tok: data file not found");
  expect_one_line_error(run + "--data=" + a + " --val_data=1:" + a + ",nan:" + b,
                        "--val_data: the weight 'nan' of source 2 is not a finite number");
  // A source holding less than its share of --eval_tokens is evaluated whole, with a
  // warning naming it (each corpus: 471 tokens, 67 packed sequences of 7 = 469 positions).
  const RunResult r = run_binary(LNS_TRAIN_BIN, run + "--data=" + a + " --val_data=0.5:" + a + ",0.5:" + b +
                                                    " --eval_tokens=2000");
  EXPECT_EQ(r.code, 0) << r.err;
  for (const std::string& p : {a, b})
    EXPECT_NE(r.err.find("--val_data source " + p + ": its share of --eval_tokens=2000 (1000) is more than it "
                         "holds; each evaluation covers all of it once (469 target positions)"),
              std::string::npos) << r.err;
}

TEST(BlendRun, SamplesAndValidationLossPerSource) {
  const std::string dir = fresh_test_dir("blend_run");
  const std::string a = corpus(dir, "a.tok", 7), b = corpus(dir, "b.tok", 11);
  const std::string train = kModel + " --steps=2 --data=0.6:" + a + ",0.4:" + b;
  // 0.5:A,0.5:B with 56 positions: each source's share, 28, equals a run on it alone.
  auto run = [&](const std::string& name, const std::string& val, int64_t tokens) {
    const RunResult r = run_binary(LNS_TRAIN_BIN, train + " --val_data=" + val + " --eval_tokens=" +
                                                      std::to_string(tokens) + " --out_dir=" + dir + "/" + name);
    EXPECT_EQ(r.code, 0) << r.err;
    return records(dir + "/" + name);
  };
  const auto blended = run("blended", "0.5:" + a + ",0.5:" + b, 56);
  const auto only_a = run("only_a", a, 28), only_b = run("only_b", b, 28);
  ASSERT_FALSE(blended.empty());
  const nlohmann::json& ev = blended.back();
  ASSERT_TRUE(ev.contains("val_loss_by_source")) << ev.dump();
  const double la = only_a.back()["val_loss"], lb = only_b.back()["val_loss"];
  EXPECT_EQ(ev["val_loss_by_source"][a].get<double>(), la);  // the same positions, the same sums
  EXPECT_EQ(ev["val_loss_by_source"][b].get<double>(), lb);
  EXPECT_NEAR(ev["val_loss"].get<double>(), (la + lb) / 2, 1e-12);  // 28 positions each
  EXPECT_EQ(ev["val_tokens"], 56);
  EXPECT_FALSE(only_a.back().contains("val_loss_by_source"));  // unweighted: as before
  // Each step record: the samples each source has given so far, the index's count.
  const auto blend = DataBlend::open("0.6:" + a + ",0.4:" + b, "--data");
  int steps = 0;
  for (const nlohmann::json& r : blended) {
    if (!r.contains("loss")) continue;
    const int64_t step = r["step"];
    ++steps;
    ASSERT_TRUE(r.contains("samples_by_source")) << r.dump();
    const uint64_t n = uint64_t(step) * 4;
    EXPECT_EQ(r["samples_by_source"][a].get<uint64_t>(), blend->index().count_before(0, n)) << r.dump();
    EXPECT_EQ(r["samples_by_source"][b].get<uint64_t>(), blend->index().count_before(1, n)) << r.dump();
    EXPECT_EQ(r["samples_by_source"][a].get<uint64_t>() + r["samples_by_source"][b].get<uint64_t>(), n);
  }
  EXPECT_EQ(steps, 2);
}

}  // namespace
}  // namespace lns
