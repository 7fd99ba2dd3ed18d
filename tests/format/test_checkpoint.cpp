// Checkpoints in one process: a saved state loads back exactly; damaged checkpoints
// (a flipped byte, a truncated or deleted shard, an edited manifest) and a config
// that contradicts the flags are clear errors naming the file; an interrupted save
// (.tmp) is never resumed from.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>

#include "lns/checkpoint/checkpoint.h"
#include "lns/data/data.h"
#include "lns/core/errors.h"
#include "lns/model/fp8_state.h"
#include "lns/checkpoint/manifest.h"
#include "lns/train/trainer.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace lns {
namespace {

using namespace lns::test;

LlamaConfig small(NormScheme s = NormScheme::LNS) {
  LlamaConfig c;
  c.vocab_size = 61, c.hidden_size = 16, c.intermediate_size = 30, c.num_layers = 2;
  c.num_heads = 2, c.num_kv_heads = 1, c.norm_scheme = s;
  return c;
}

TrainConfig run_config(const std::string& out) {
  TrainConfig t;
  t.data = "random", t.seq_len = 8, t.micro_batch = 2, t.global_batch = 4, t.steps = 3;
  t.out_dir = out;
  return t;
}

std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/lns_ck_" + std::to_string(::getpid()) + "_" + name;
  fs::remove_all(d);
  return d;
}

TEST(Checkpoint, SavesAndLoadsExactly) {
  const std::string out = fresh_dir("exact");
  Trainer a(small(), run_config(out));
  for (int i = 0; i < 3; ++i) a.train_step();
  const std::string dir = a.save_checkpoint();
  EXPECT_EQ(dir, out + "/checkpoints/step_0000003");
  EXPECT_EQ(find_latest_checkpoint(out), dir);

  TrainConfig rc = run_config(out);
  rc.resume = "auto";
  Trainer b(small(), rc);
  EXPECT_EQ(b.optimizer().steps_taken(), 3);
  EXPECT_EQ(b.sampler().consumed(), a.sampler().consumed());
  const Tensor pa = a.model().params().flat_params(), pb = b.model().params().flat_params();
  EXPECT_EQ(std::memcmp(pa.data, pb.data, pa.nbytes()), 0);
  const Tensor ma = a.optimizer().exp_avg_sq(), mb = b.optimizer().exp_avg_sq();
  EXPECT_EQ(std::memcmp(ma.data, mb.data, ma.nbytes()), 0);
  // The next step is the same step.
  EXPECT_EQ(a.train_step().loss, b.train_step().loss);
}

// --fp8: the scaling state (every tensor's scale and amax history) goes into the
// checkpoint, so a resumed FP8 run is the uninterrupted one bit for bit; different
// scaling settings are refused; a checkpoint saved without FP8 starts the scales at 1.
// --fp8=blockwise keeps no scaling state: its checkpoints record the mode and no tensors,
// resume bit-exact, and refuse to continue under --fp8=delayed.
TEST(Checkpoint, Fp8BlockwiseResumesBitExact) {
  const std::string out = fresh_dir("fp8b");
  LlamaConfig m = small();
  m.fp8 = Fp8Mode::Blockwise;
  Trainer a(m, run_config(out));
  for (int i = 0; i < 3; ++i) a.train_step();
  a.save_checkpoint();
  TrainConfig rc = run_config(out);
  rc.resume = "auto";
  Trainer b(m, rc);
  for (int i = 0; i < 3; ++i) {
    const StepStats sa = a.train_step(), sb = b.train_step();
    EXPECT_EQ(sa.loss, sb.loss) << "step " << sa.step;
    EXPECT_EQ(sa.grad_norm, sb.grad_norm) << "step " << sa.step;
  }
  std::ifstream in(find_latest_checkpoint(out) + "/manifest.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["fp8"]["mode"], "blockwise");
  EXPECT_EQ(j["fp8"]["tensors"].size(), 0u);
  LlamaConfig longer = m;  // the delayed-scaling settings do not matter to blockwise scales
  longer.fp8_scaling.history = 16;
  EXPECT_EQ(error_of([&] { Trainer c(longer, rc); }), "(no error)");
  LlamaConfig delayed = m;
  delayed.fp8 = Fp8Mode::Delayed;
  const std::string e = error_of([&] { Trainer c(delayed, rc); });
  EXPECT_NE(e.find("the checkpoint's FP8 scaling is --fp8=blockwise"), std::string::npos) << e;
}

TEST(Checkpoint, Fp8ScalingStateResumesBitExact) {
  const std::string out = fresh_dir("fp8");
  LlamaConfig m = small();
  m.fp8 = Fp8Mode::Delayed;
  m.fp8_scaling.history = 3;  // shorter than the run: the ring buffer wraps before and after the save
  Trainer a(m, run_config(out));
  for (int i = 0; i < 4; ++i) a.train_step();
  a.save_checkpoint();
  TrainConfig rc = run_config(out);
  rc.resume = "auto";
  Trainer b(m, rc);
  EXPECT_EQ(b.model().fp8()->state(), a.model().fp8()->state());
  for (int i = 0; i < 3; ++i) {
    const StepStats sa = a.train_step(), sb = b.train_step();
    EXPECT_EQ(sa.loss, sb.loss) << "step " << sa.step;
    EXPECT_EQ(sa.grad_norm, sb.grad_norm) << "step " << sa.step;
  }
  const Tensor pa = a.model().params().flat_params(), pb = b.model().params().flat_params();
  EXPECT_EQ(std::memcmp(pa.data, pb.data, pa.nbytes()), 0);

  // Other scaling settings: one line naming them.
  LlamaConfig other = m;
  other.fp8_scaling.history = 4;
  try {
    Trainer c(other, rc);
    ADD_FAILURE() << "a different --fp8_amax_history was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("the checkpoint's FP8 scaling is --fp8=delayed --fp8_amax_history=3"),
              std::string::npos) << e.what();
  }
  // A damaged FP8 record (its manifest CRC redone, so that only the record is wrong).
  const std::string saved = find_latest_checkpoint(out);
  const auto damaged = [&](const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    const std::string d = out + "/" + name;
    fs::copy(saved, d, fs::copy_options::recursive);
    std::ifstream in(d + "/manifest.json");
    nlohmann::json j = nlohmann::json::parse(in);
    edit(j);
    j["manifest_crc32"] = manifest_crc(j);
    std::ofstream(d + "/manifest.json") << j.dump();
    TrainConfig t = run_config(out);
    t.resume = d;
    return t;
  };
  const auto resume_error = [&](const LlamaConfig& c, const TrainConfig& t) {
    return error_of([&] { Trainer x(c, t); });
  };
  EXPECT_NE(resume_error(m, damaged("fp8_file", [](nlohmann::json& j) { j["fp8"]["tensors"][0]["file"] = "x.safetensors"; }))
                .find("fp8.tensors[0].file: 'x.safetensors' is not listed in files"),
            std::string::npos);
  EXPECT_NE(resume_error(m, damaged("fp8_key", [](nlohmann::json& j) { j["fp8"]["tensors"][0]["key"] = "fp8/nope"; }))
                .find("is not a 1-D F32 entry 'fp8/nope'"),
            std::string::npos);
  EXPECT_NE(resume_error(m, damaged("fp8_mode", [](nlohmann::json& j) { j["fp8"]["mode"] = "blockwise"; }))
                .find("entries; --fp8=blockwise keeps no scaling state"),
            std::string::npos);
  LlamaConfig two = m;
  two.fp8_scaling.history = 2;  // the record says 2, the stored states hold 3 + 3 values
  EXPECT_NE(resume_error(two, damaged("fp8_len", [](nlohmann::json& j) { j["fp8"]["amax_history"] = 2; }))
                .find("FP8 scaling state has 6 values, expected 5"),
            std::string::npos);

  // Without --fp8 the state is ignored; from a checkpoint without it, the scales start at 1.
  LlamaConfig plain = small();
  Trainer d(plain, rc);
  EXPECT_EQ(d.model().fp8(), nullptr);
  const std::string out2 = fresh_dir("fp8_from_plain");
  Trainer e(plain, run_config(out2));
  e.train_step();
  e.save_checkpoint();
  TrainConfig rc2 = run_config(out2);
  rc2.resume = "auto";
  Trainer f(m, rc2);
  for (const std::vector<float>& st : f.model().fp8()->state()) EXPECT_EQ(st[0], 1.0f);
}

TEST(Checkpoint, DamageIsNamed) {
  const std::string out = fresh_dir("damage");
  Trainer a(small(), run_config(out));
  a.train_step();
  const std::string dir = a.save_checkpoint();
  auto variant = [&](const std::string& name) {
    const std::string d = out + "/" + name;
    fs::copy(dir, d, fs::copy_options::recursive);
    return d;
  };
  const std::string shard = "/rank_00000.safetensors";

  const std::string flipped = variant("flipped");
  {
    std::fstream f(flipped + shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-100, std::ios::end);
    char c;
    f.read(&c, 1);
    c ^= 0x5a;
    f.seekp(-100, std::ios::end);
    f.write(&c, 1);
  }
  EXPECT_EQ(error_of([&] { Checkpoint c(flipped); }), flipped + shard + ": checksum mismatch (corrupt shard)");

  const std::string truncated = variant("truncated");
  fs::resize_file(truncated + shard, fs::file_size(truncated + shard) - 7);
  EXPECT_NE(error_of([&] { Checkpoint c(truncated); }).find(truncated + shard + ": has "), std::string::npos);

  const std::string deleted = variant("deleted");
  fs::remove(deleted + shard);
  EXPECT_EQ(error_of([&] { Checkpoint c(deleted); }),
            deleted + shard + ": missing shard of checkpoint " + deleted);

  const std::string edited = variant("edited");
  {
    std::ifstream in(edited + "/manifest.json");
    std::string text((std::istreambuf_iterator<char>(in)), {});
    const auto at = text.find("\"tp\": 1");
    ASSERT_NE(at, std::string::npos);
    text.replace(at, 7, "\"tp\": 2");
    std::ofstream(edited + "/manifest.json") << text;
  }
  EXPECT_EQ(error_of([&] { Checkpoint c(edited); }),
            edited + "/manifest.json: checksum mismatch: the manifest was edited or is corrupt");

  const std::string half = variant("step_0000009.tmp");  // an interrupted save
  fs::rename(half, out + "/checkpoints/step_0000009.tmp");
  EXPECT_EQ(find_latest_checkpoint(out), dir);
  EXPECT_NE(error_of([&] { Checkpoint c(out + "/nowhere"); }).find("manifest.json: missing"), std::string::npos);
}

TEST(Checkpoint, ConfigThatContradictsTheFlagsIsNamed) {
  const std::string out = fresh_dir("config");
  Trainer a(small(NormScheme::LNS), run_config(out));
  a.train_step();
  const std::string dir = a.save_checkpoint();
  TrainConfig rc = run_config(out);
  rc.resume = dir;
  EXPECT_EQ(error_of([&] { Trainer b(small(NormScheme::Pre), rc); }),
            dir + "/manifest.json: the checkpoint's norm_scheme is \"lns\" but the flags say \"pre\"");
}

// --keep_checkpoints removes only older complete checkpoints that hold nothing but
// their own files; a leftover .tmp of this step is removed only when it holds nothing
// but what a save writes. Nothing else is ever deleted.
TEST(Checkpoint, PruningAndCleanupDeleteOnlyTheirOwnFiles) {
  const std::string out = fresh_dir("prune");
  TrainConfig t = run_config(out);
  t.keep_checkpoints = 2;
  Trainer a(small(), t);
  const std::string ck = out + "/checkpoints";
  a.train_step();
  a.save_checkpoint();  // step 1
  std::ofstream(ck + "/step_0000001/notes.txt") << "mine";
  a.train_step();
  a.save_checkpoint();  // step 2
  a.train_step();
  a.save_checkpoint();  // step 3: step 1 would go, but it holds notes.txt
  EXPECT_TRUE(fs::exists(ck + "/step_0000001/notes.txt"));
  EXPECT_TRUE(fs::exists(ck + "/step_0000001/manifest.json"));
  fs::remove(ck + "/step_0000001/notes.txt");
  a.train_step();
  a.save_checkpoint();  // step 4: steps 1 and 2 go, 3 and 4 stay
  EXPECT_FALSE(fs::exists(ck + "/step_0000001"));
  EXPECT_FALSE(fs::exists(ck + "/step_0000002"));
  EXPECT_TRUE(fs::exists(ck + "/step_0000003/manifest.json"));
  EXPECT_EQ(find_latest_checkpoint(out), ck + "/step_0000004");
  // A .tmp left by a save of step 5 that died: removed when it holds only a save's files,
  // refused (naming the stranger) when it holds anything else.
  fs::create_directories(ck + "/step_0000005.tmp");
  std::ofstream(ck + "/step_0000005.tmp/rank_00000.safetensors") << "partial";
  std::ofstream(ck + "/step_0000005.tmp/rank_00000.safetensors.tmp-abc123") << "partial";
  a.train_step();
  EXPECT_EQ(a.save_checkpoint(), ck + "/step_0000005");
  fs::create_directories(ck + "/step_0000006.tmp");
  std::ofstream(ck + "/step_0000006.tmp/thesis.pdf") << "precious";
  a.train_step();
  EXPECT_EQ(error_of([&] { a.save_checkpoint(); }),
            ck + "/step_0000006.tmp: left over from an interrupted save, but it holds 'thesis.pdf', which a save "
                 "does not write; move it away and restart");
  EXPECT_TRUE(fs::exists(ck + "/step_0000006.tmp/thesis.pdf"));
}

}  // namespace
}  // namespace lns
