// TensorBoard's event files (lns/train/tensorboard.h): the record framing against published
// CRC-32C vectors and TensorBoard's own Python writer, the Events' bytes against
// TensorBoard's protos, the scalars a record becomes, and the cut of a resumed run.
// tests/python/test_tensorboard.py reads whole runs back with TensorBoard's loaders.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "lns/core/errors.h"
#include "lns/train/tensorboard.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace lns {
namespace {

using namespace lns::test;

std::string unhex(std::string_view h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(std::string(h.substr(i, 2)), nullptr, 16)));
  return out;
}

TEST(TensorBoard, Crc32cKnownVectors) {
  // The check value of CRC-32C, and the 32-byte vectors of RFC 3720 (iSCSI), B.4.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  std::string up;
  for (int i = 0; i < 32; ++i) up.push_back(static_cast<char>(i));
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(up.data(), 32), 0x46DD794Eu);
}

TEST(TensorBoard, MaskIsRotateRightFifteenPlusConstant) {
  // Values from tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c.
  EXPECT_EQ(mask_crc32c(crc32c("123456789", 9)), 0xC78AB0E5u);
  EXPECT_EQ(mask_crc32c(crc32c("", 0)), 0xA282EAD8u);
  const std::string zero_len(8, '\0');
  EXPECT_EQ(mask_crc32c(crc32c(zero_len.data(), 8)), 0x07980329u);
  // The formula itself: rotate right by 15, add 0xa282ead8 (mod 2^32).
  for (uint32_t c : {0u, 1u, 0x8000u, 0xFFFFFFFFu, 0xE3069283u})
    EXPECT_EQ(mask_crc32c(c), static_cast<uint32_t>(((c >> 15) | (c << 17)) + 0xA282EAD8u)) << c;
}

TEST(TensorBoard, FrameMatchesTensorBoardsRecordWriter) {
  // tensorboard.summary.writer.record_writer.RecordWriter(...).write(b"lns")
  EXPECT_EQ(frame_record("lns"), unhex("0300000000000000b099490e6c6e7362d7be46"));
  const std::string two = frame_record("lns") + frame_record(std::string(300, 'x'));
  size_t end = 0;
  EXPECT_EQ(read_records(two, &end), (std::vector<std::string>{"lns", std::string(300, 'x')}));
  EXPECT_EQ(end, two.size());
}

TEST(TensorBoard, ReadStopsAtCutShortOrCorruptRecords) {
  const std::string a = frame_record("first"), b = frame_record("second");
  size_t end = 0;
  for (size_t cut = 1; cut < b.size(); ++cut) {  // a crash in the middle of the second record
    EXPECT_EQ(read_records(a + b.substr(0, cut), &end), std::vector<std::string>{"first"}) << cut;
    EXPECT_EQ(end, a.size());
  }
  for (size_t i = 0; i < b.size(); ++i) {  // any flipped byte of the second record is caught
    std::string bad = a + b;
    bad[a.size() + i] ^= 0x10;
    EXPECT_EQ(read_records(bad, &end), std::vector<std::string>{"first"}) << "byte " << i;
    EXPECT_EQ(end, a.size());
  }
}

// The events of the only lns file in dir.
std::vector<std::string> events_in(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (is_lns_event_file(e.path().filename().string())) files.push_back(e.path().string());
  EXPECT_EQ(files.size(), 1u);
  return files.empty() ? std::vector<std::string>{} : read_records(slurp(files[0]));
}

TEST(TensorBoard, EventBytesAreTensorBoards) {
  // Each expected payload is tensorboard.compat.proto.event_pb2.Event(...).SerializeToString()
  // with wall_time 3.0, 2.0 and 1.5; ours carry the clock, so bytes 1..8 (the double) differ.
  const std::string dir = fresh_test_dir("tb_bytes");
  make_tensorboard_sink(dir, 4, "0000abcd")->write({{"step", 7}, {"loss", 2.5}});
  const std::vector<std::string> ev = events_in(dir);
  ASSERT_EQ(ev.size(), 3u);
  const std::string want[] = {
      unhex("0900000000000008401a0d627261696e2e4576656e743a32"),          // file_version "brain.Event:2"
      unhex("09000000000000004010053a020801"),                            // step 5, SessionLog START
      unhex("09000000000000f83f10072a130a110a0a747261696e2f6c6f73731500002040")};  // step 7, train/loss 2.5
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(ev[i].size(), want[i].size()) << i;
    EXPECT_EQ(ev[i][0], want[i][0]) << i;
    EXPECT_EQ(ev[i].substr(9), want[i].substr(9)) << i;
  }
}

double find(const std::vector<TensorBoardScalar>& s, const std::string& tag) {
  for (const TensorBoardScalar& x : s)
    if (x.tag == tag) return x.value;
  ADD_FAILURE() << "no scalar " << tag;
  return -999;
}

TEST(TensorBoard, ScalarsOfEachRecordKind) {
  auto step = tensorboard_scalars(nlohmann::json::parse(
      R"({"step":3,"loss":2.5,"lr":0.001,"grad_norm":0.7,"tokens_per_s":900,"mfu":0.4,"peak_memory_bytes":1024,
          "startup_s":{"total":1.5},"comm_bytes":{"dp.all_reduce":64},"ln_free_fixed":2})"));
  EXPECT_EQ(step.size(), 9u);
  EXPECT_EQ(find(step, "train/loss"), 2.5);
  EXPECT_EQ(find(step, "train/lr"), 0.001);
  EXPECT_EQ(find(step, "perf/tokens_per_s"), 900);
  EXPECT_EQ(find(step, "perf/mfu"), 0.4);
  EXPECT_EQ(find(step, "perf/peak_memory_bytes"), 1024);
  EXPECT_EQ(find(step, "startup_s/total"), 1.5);
  EXPECT_EQ(find(step, "comm_bytes/dp.all_reduce"), 64);
  EXPECT_EQ(find(step, "ln_free/fixed"), 2);

  auto ev = tensorboard_scalars(nlohmann::json::parse(R"({"step":4,"val_loss":2,"val_ppl":7.4,"val_tokens":64})"));
  EXPECT_EQ(ev.size(), 3u);
  EXPECT_EQ(find(ev, "eval/ppl"), 7.4);

  auto diag = tensorboard_scalars(nlohmann::json::parse(
      R"({"step":4,"diag":[{"layer":0,"variance":1.5,"grad_norm":-1},{"layer":7,"variance":3,"grad_norm":0.5}]})"));
  EXPECT_EQ(diag.size(), 3u);  // grad_norm -1: not computed, left out
  EXPECT_EQ(find(diag, "diag/variance/layer_07"), 3);
  EXPECT_EQ(find(diag, "diag/grad_norm/layer_07"), 0.5);

  auto fp8 = tensorboard_scalars(nlohmann::json::parse(
      R"({"step":2,"fp8":[{"layer":1,"linear":"q_proj","tensor":"x","amax":3,"scale":2,"saturated":0.25,"flushed":0,"nonfinite":1},
                          {"layer":1,"linear":"q_proj","tensor":"w","amax":1,"scale":4,"saturated":0.5,"flushed":0.1,"nonfinite":2}]})"));
  EXPECT_EQ(fp8.size(), 13u);
  EXPECT_EQ(find(fp8, "fp8/amax/layer_01.q_proj.x"), 3);
  EXPECT_EQ(find(fp8, "fp8/saturated_max"), 0.5);
  EXPECT_EQ(find(fp8, "fp8/flushed_max"), 0.1);
  EXPECT_EQ(find(fp8, "fp8/nonfinite_total"), 3);

  auto rerun = tensorboard_scalars(nlohmann::json::parse(
      R"({"step":6,"rerun":"reproduced","why":"spike","loss":9,"rerun_loss":9,"stream_index":20,"samples":[3,1],"skipped":false})"));
  EXPECT_EQ(rerun.size(), 5u);  // the sample ids and the reason are not scalars
  EXPECT_EQ(find(rerun, "rerun/reproduced"), 1);
  EXPECT_EQ(find(rerun, "rerun/skipped"), 0);
  EXPECT_EQ(find(rerun, "rerun/stream_index"), 20);

  auto strag = tensorboard_scalars(nlohmann::json::parse(
      R"({"step":20,"compute_s":{"min":1,"max":2,"slowest_rank":1},"rank_compute_s":[1,2],
          "stragglers":[{"rank":1,"host":"n1","compute_s":2,"median_s":1.5,"slowdown":1.33,"windows":3}]})"));
  EXPECT_EQ(strag.size(), 10u);
  EXPECT_EQ(find(strag, "straggler/rank_compute_s/1"), 2);
  EXPECT_EQ(find(strag, "straggler/slowdown/rank_1"), 1.33);
  EXPECT_EQ(find(strag, "straggler/stragglers_named"), 1);

  auto ckpt = tensorboard_scalars(nlohmann::json::parse(R"({"step":4,"checkpoint":"d","save_stall_s":0.5,"async":true})"));
  EXPECT_EQ(ckpt.size(), 2u);
  EXPECT_EQ(find(ckpt, "checkpoint/async"), 1);

  auto other = tensorboard_scalars(nlohmann::json::parse(R"({"step":1,"something_new":{"a":1}})"));
  EXPECT_EQ(find(other, "metrics/something_new/a"), 1);
}

// The steps of the summary events of every lns file in dir, in file order.
std::vector<int64_t> summary_steps(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (is_lns_event_file(e.path().filename().string())) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  std::vector<int64_t> steps;
  for (const std::string& f : files)
    for (const std::string& p : read_records(slurp(f))) {
      // field 2 (step, varint) follows the 9 bytes of wall_time; a summary is field 5 (0x2a)
      if (p.size() > 11 && p[9] == 0x10 && p[11] == 0x2a) steps.push_back(static_cast<unsigned char>(p[10]));
    }
  return steps;
}

TEST(TensorBoard, ResumeCutsBackAndOrdersFiles) {
  const std::string dir = fresh_test_dir("tb_resume"), other_dir = fresh_test_dir("tb_resume_other");
  const std::string run = tensorboard_run_id(dir + "/run"), other = tensorboard_run_id(other_dir + "/run");
  ASSERT_NE(run, other);
  EXPECT_EQ(run, tensorboard_run_id(dir + "/./x/../run/"));  // the same directory, however spelled
  spit(dir + "/events.out.tfevents.1.other.tool", "not ours");  // another writer's file is left alone
  {
    auto sink = make_tensorboard_sink(dir, 0, other);  // another lns run sharing the directory
    for (int s = 1; s <= 3; ++s) sink->write({{"step", s}, {"loss", 1.0 / s}});
  }
  std::string other_name;
  for (const auto& e : fs::directory_iterator(dir))
    if (is_lns_event_file(e.path().filename().string())) other_name = e.path().string();
  EXPECT_EQ(event_file_run_id(fs::path(other_name).filename().string()), other);
  const std::string other_bytes = slurp(other_name);
  fs::rename(other_name, other_dir + "/keep");  // out of the way until the end
  {
    auto sink = make_tensorboard_sink(dir, 0, run);
    for (int s = 1; s <= 6; ++s) sink->write({{"step", s}, {"loss", 1.0 / s}});
  }
  std::string name;
  for (const auto& e : fs::directory_iterator(dir))
    if (is_lns_event_file(e.path().filename().string())) name = e.path().string();
  EXPECT_EQ(event_file_run_id(fs::path(name).filename().string()), run);
  spit(name, slurp(name) + frame_record("cut short by a crash").substr(0, 10));
  EXPECT_EQ(summary_steps(dir), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));

  EXPECT_EQ(truncate_tensorboard(dir, 4, run), 2);  // steps 5 and 6 (and the torn record)
  EXPECT_EQ(summary_steps(dir), (std::vector<int64_t>{1, 2, 3, 4}));
  const std::string kept = slurp(name);
  size_t end = 0;
  read_records(kept, &end);
  EXPECT_EQ(end, kept.size());
  EXPECT_EQ(truncate_tensorboard(dir, 4, run), 0);  // nothing more to cut: the file is not rewritten
  EXPECT_EQ(slurp(name), kept);
  {
    auto sink = make_tensorboard_sink(dir, 4, run);  // same second: still sorts after the first file
    for (int s = 5; s <= 8; ++s) sink->write({{"step", s}, {"loss", 1.0 / s}});
  }
  EXPECT_EQ(summary_steps(dir), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));

  // A start from scratch removes this run's files, and only those.
  fs::rename(other_dir + "/keep", other_name);
  EXPECT_EQ(truncate_tensorboard(dir, 0, run), 8);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{dir + "/events.out.tfevents.1.other.tool", other_name}));
  EXPECT_EQ(slurp(dir + "/events.out.tfevents.1.other.tool"), "not ours");
  EXPECT_EQ(slurp(other_name), other_bytes);
}

// Event files mangled (bytes flipped in a payload whose CRC is then made right, a payload
// cut short and re-framed, raw bytes flipped, a length field set to a huge value): the cut
// on resume never crashes or throws (tests/sanitize.sh runs this under ASan/UBSan) and
// leaves a file of whole records, or none.
TEST(TensorBoard, CutSurvivesMangledFiles) {
  std::string dir = fresh_test_dir("tb_mangled");
  if (::access("/dev/shm", W_OK) == 0) {  // hundreds of fsynced rewrites: on tmpfs where there is one
    fs::remove_all(dir);
    dir = "/dev/shm/lns_tb_mangled_" + std::to_string(::getpid());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  const std::string run = "0000abcd";
  {
    auto sink = make_tensorboard_sink(dir, 0, run);
    for (int s = 1; s <= 6; ++s)
      sink->write({{"step", s}, {"loss", 1.0 / s}, {"diag", {{{"layer", 0}, {"variance", s}}, {{"layer", 1}, {"variance", 2 * s}}}}});
  }
  std::string name;
  for (const auto& e : fs::directory_iterator(dir))
    if (is_lns_event_file(e.path().filename().string())) name = e.path().string();
  const std::vector<std::string> recs = read_records(slurp(name));
  ASSERT_EQ(recs.size(), 8u);  // version, START, 6 steps
  std::mt19937_64 rng(20261129);
  int removed = 0, cut = 0;
  for (int it = 0; it < 400; ++it) {
    std::vector<std::string> r = recs;
    std::string& victim = r[rng() % r.size()];
    std::string bytes;
    const int kind = static_cast<int>(rng() % 4);
    if (kind == 0) {
      for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) victim[rng() % victim.size()] = static_cast<char>(rng());
    } else if (kind == 1) {
      victim.resize(rng() % victim.size());
    }
    for (const std::string& p : r) bytes += frame_record(p);
    if (kind == 2) {
      for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    } else if (kind == 3) {  // a length of 2^62 with its CRC made right
      const size_t at = frame_record(r[0]).size();
      const uint64_t n = uint64_t{1} << 62;
      std::memcpy(&bytes[at], &n, 8);
      const uint32_t c = mask_crc32c(crc32c(&bytes[at], 8));
      std::memcpy(&bytes[at + 8], &c, 4);
    }
    spit(name, bytes);
    ASSERT_NO_THROW(truncate_tensorboard(dir, 3, run)) << "iteration " << it << ", kind " << kind;
    if (!fs::exists(name)) {
      ++removed;
      continue;
    }
    const std::string kept = slurp(name);
    size_t end = 0;
    read_records(kept, &end);
    EXPECT_EQ(end, kept.size()) << "iteration " << it << ", kind " << kind;
    cut += kept.size() < bytes.size();
  }
  std::printf("mangled event files: %d cut back, %d removed (nothing of them left) of 400\n", cut, removed);
  EXPECT_GT(cut, 0);
  fs::remove_all(dir);
}

TEST(TensorBoard, RunIdOfFileNames) {
  EXPECT_EQ(event_file_run_id("events.out.tfevents.1795941112.n01.cluster.8212.0a1b2c3d.lns"), "0a1b2c3d");
  EXPECT_TRUE(is_lns_event_file("events.out.tfevents.1795941112.n01.cluster.8212.0a1b2c3d.lns"));
  EXPECT_FALSE(is_lns_event_file("events.out.tfevents.1795941112.n01.8212.lns"));        // no run id
  EXPECT_FALSE(is_lns_event_file("events.out.tfevents.1795941112.n01.8212.0A1B2C3D.lns"));  // not ours
  EXPECT_FALSE(is_lns_event_file("events.out.tfevents.x.n01.8212.0a1b2c3d.lns"));          // no time
  EXPECT_FALSE(is_lns_event_file("events.out.tfevents.1795941112.n01.v2"));
}

TEST(TensorBoard, UncreatableDirectoryNamesTheFlag) {
  const std::string dir = fresh_test_dir("tb_bad");
  spit(dir + "/file", "");
  try {
    make_tensorboard_sink(dir + "/file/tb", 0, "0000abcd");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--tensorboard_dir=" + dir + "/file/tb"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lns
