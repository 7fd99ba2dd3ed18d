// No tool deletes or changes what it did not create. lns_convert, as a user runs it:
// an existing --out is refused unless it is an lns checkpoint (or an earlier export)
// and --overwrite says so, replaced atomically; a failure half-way leaves neither a
// partial output nor a staging directory; export-hf checks every input first.
// Every refusal is asserted byte for byte: the directory it pointed at is unchanged.
#include <filesystem>
#include <set>

#include "lns/checkpoint/checkpoint.h"
#include "lns/core/files.h"
#include "lns/train/trainer.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace lns {
namespace {

using namespace lns::test;

const std::string kConvert = LNS_CONVERT_BIN;

// A trained one-rank checkpoint (2 steps) inside `root`.
std::string trained(const std::string& root) {
  TrainConfig t;
  t.data = "random", t.seq_len = 8, t.micro_batch = 2, t.global_batch = 4, t.steps = 2;
  t.out_dir = root + "/run";
  Trainer tr(small_model(NormScheme::LNS), t);
  tr.train_step();
  tr.train_step();
  return tr.save_checkpoint();
}

// Names in dir's parent that start with dir's name + ".tmp": staging left behind.
std::vector<std::string> staging_leftovers(const std::string& dir) {
  std::vector<std::string> out;
  const fs::path p(dir);
  for (const auto& e : fs::directory_iterator(p.parent_path()))
    if (e.path().filename().string().rfind(p.filename().string() + ".tmp", 0) == 0)
      out.push_back(e.path().string());
  return out;
}

void expect_refused(const RunResult& r, const std::string& needle) {
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.last_line().find(needle), std::string::npos) << r.err;
  EXPECT_NE(r.last_line().find("lns_convert: error: "), std::string::npos) << r.err;
}

TEST(NoDataLoss, ConvertRefusesAnExistingDirectory) {
  const std::string root = fresh_test_dir("ndl_refuse");
  const std::string ck = trained(root);
  // The run directory itself: checkpoints, metrics, logs. The old lns_convert
  // deleted all of it and exited 0.
  const std::string run = root + "/run";
  fs::create_directories(run + "/logs");
  spit(run + "/metrics.jsonl", "{\"step\": 1}\n");
  spit(run + "/logs/rank0.log", "log\n");
  const auto before = snapshot(root);
  for (const char* cmd : {"merge", "reshard --tp=1 --pp=1", "remove-layers --layers=1"}) {
    expect_refused(run_binary(kConvert, std::string(cmd) + " --in=" + ck + " --out=" + run),
                   "--out=" + run + ": exists and is not empty; refusing to write into it");
    // --overwrite replaces only a checkpoint.
    expect_refused(run_binary(kConvert, std::string(cmd) + " --in=" + ck + " --out=" + run + " --overwrite"),
                   "--out=" + run + ": --overwrite replaces only an lns checkpoint, and this is not one "
                   "(no manifest.json)");
  }
  expect_refused(run_binary(kConvert, "export-hf --in=" + ck + " --out=" + run + " --overwrite"),
                 "--overwrite replaces only a Hugging Face export of lns_convert, and this is not one");
  // A file is never replaced by a directory.
  spit(root + "/notes.txt", "mine");
  expect_refused(run_binary(kConvert, "merge --in=" + ck + " --out=" + root + "/notes.txt --overwrite"),
                 "exists and is not a directory");
  fs::remove(root + "/notes.txt");
  // A checkpoint is refused without --overwrite, and with it when it holds anything
  // besides its own files.
  expect_refused(run_binary(kConvert, "merge --in=" + ck + " --out=" + ck),
                 "exists and is not empty; refusing to write into it (choose a new directory, or add "
                 "--overwrite to replace an lns checkpoint there)");
  EXPECT_EQ(snapshot(root), before);
  spit(ck + "/README", "notes");
  const auto with_notes = snapshot(root);
  expect_refused(run_binary(kConvert, "merge --in=" + ck + " --out=" + ck + " --overwrite"),
                 "--overwrite replaces only an lns checkpoint and nothing else, but it also holds 'README'");
  EXPECT_EQ(snapshot(root), with_notes);
  EXPECT_TRUE(staging_leftovers(ck).empty());
  EXPECT_TRUE(staging_leftovers(run).empty());
}

TEST(NoDataLoss, OverwriteReplacesACheckpointWhole) {
  const std::string root = fresh_test_dir("ndl_overwrite");
  const std::string ck = trained(root);
  const std::string out = root + "/out";
  RunResult r = run_binary(kConvert, "merge --in=" + ck + " --out=" + out);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<float> before = Checkpoint(out).logical("model.norm.weight", "param");
  const auto old_files = snapshot(out);
  // Resharded over it: tp=2 files replace the single rank file.
  r = run_binary(kConvert, "reshard --tp=2 --in=" + ck + " --out=" + out + " --overwrite");
  ASSERT_EQ(r.code, 0) << r.err;
  const Checkpoint now(out);
  EXPECT_EQ(now.layout().tp, 2);
  EXPECT_EQ(now.logical("model.norm.weight", "param"), before);
  std::set<std::string> names;
  for (const auto& [path, bytes] : snapshot(out)) names.insert(path);
  EXPECT_EQ(names, (std::set<std::string>{"manifest.json", "rank_00000.safetensors", "rank_00001.safetensors"}));
  EXPECT_NE(snapshot(out), old_files);
  EXPECT_TRUE(staging_leftovers(out).empty());
  // An empty directory is an allowed target (and so is one that does not exist yet,
  // below a parent that does not either).
  fs::create_directories(root + "/empty");
  EXPECT_EQ(run_binary(kConvert, "merge --in=" + ck + " --out=" + root + "/empty").code, 0);
  EXPECT_EQ(run_binary(kConvert, "merge --in=" + ck + " --out=" + root + "/a/b/c/").code, 0);
  EXPECT_NO_THROW(Checkpoint(root + "/a/b/c"));
}

TEST(NoDataLoss, AFailureHalfWayLeavesNothing) {
  const std::string root = fresh_test_dir("ndl_halfway");
  const std::string ck = trained(root);
  // A checkpoint with one piece listed twice: it opens (each piece on its own is
  // valid) but fails while the conversion is being written, at the last tensor.
  nlohmann::json m = nlohmann::json::parse(slurp(ck + "/manifest.json"));
  auto& t = m["tensors"];
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i]["kind"] == "param" && t[i]["tensor"] == "lm_head.weight") {
      t.push_back(nlohmann::json(t[i]));
      break;
    }
  m["manifest_crc32"] = manifest_crc(m);
  spit(ck + "/manifest.json", m.dump(1));
  const std::string out = root + "/out";
  const auto before = snapshot(root);
  const RunResult r = run_binary(kConvert, "merge --in=" + ck + " --out=" + out);
  expect_refused(r, "manifest.json: param of 'lm_head.weight': pieces overlap at element 0");
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(staging_leftovers(out).empty());
  EXPECT_EQ(snapshot(root), before);
  // The same over an existing checkpoint with --overwrite: the old one is intact.
  ASSERT_EQ(run_binary(kConvert, "merge --in=" + trained(fresh_test_dir("ndl_halfway_src")) + " --out=" + out).code, 0);
  const auto kept = snapshot(root);
  expect_refused(run_binary(kConvert, "merge --in=" + ck + " --out=" + out + " --overwrite"),
                 "pieces overlap at element 0");
  EXPECT_EQ(snapshot(root), kept);
  EXPECT_TRUE(staging_leftovers(out).empty());
}

TEST(NoDataLoss, ExportChecksEveryInputBeforeWriting) {
  const std::string root = fresh_test_dir("ndl_export");
  const std::string ck = trained(root);
  const std::string hf = root + "/hf";
  expect_refused(run_binary(kConvert, "export-hf --in=" + ck + " --out=" + hf + " --tokenizer=" + root + "/none.json"),
                 "--tokenizer=" + root + "/none.json: not found");
  EXPECT_FALSE(fs::exists(hf));
  fs::create_directories(root + "/tok_empty");
  expect_refused(run_binary(kConvert, "export-hf --in=" + ck + " --out=" + hf + " --tokenizer=" + root + "/tok_empty"),
                 "the directory holds none of tokenizer.json");
  EXPECT_FALSE(fs::exists(hf));
  EXPECT_TRUE(staging_leftovers(hf).empty());
  spit(root + "/tokenizer.json", "{}");
  ASSERT_EQ(run_binary(kConvert, "export-hf --in=" + ck + " --out=" + hf + " --tokenizer=" + root + "/tokenizer.json").code, 0);
  std::set<std::string> names;
  for (const auto& [path, bytes] : snapshot(hf)) names.insert(path);
  EXPECT_EQ(names, (std::set<std::string>{"config.json", "model.safetensors", "tokenizer.json"}));
  const auto first = snapshot(hf);
  expect_refused(run_binary(kConvert, "export-hf --in=" + ck + " --out=" + hf), "exists and is not empty");
  EXPECT_EQ(snapshot(hf), first);
  // An earlier export of ours may be replaced; this one without the tokenizer.
  ASSERT_EQ(run_binary(kConvert, "export-hf --in=" + ck + " --out=" + hf + " --overwrite").code, 0);
  names.clear();
  for (const auto& [path, bytes] : snapshot(hf)) names.insert(path);
  EXPECT_EQ(names, (std::set<std::string>{"config.json", "model.safetensors"}));
}

}  // namespace
}  // namespace lns
