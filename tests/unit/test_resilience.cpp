// The pure parts of fault handling (docs/resilience.md), each against numbers worked
// out by hand: which ranks the watchdog names from heartbeats, the straggler rule, the
// suspicious-step rule, the fault-injection grammar, the gradient fingerprint, and the
// watchdog itself firing on a section that makes no progress (in a child process).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>
#include <atomic>

#include "lns/core/errors.h"
#include "lns/core/exit_status.h"
#include "lns/train/fault_injection.h"
#include "lns/train/step_guard.h"
#include "lns/train/straggler.h"
#include "parallel/comm_activity.h"
#include "parallel/watchdog.h"
#include "test_util.h"

namespace lns {
namespace {

// A fresh directory of this test process.
std::string make_temp_dir(const std::string& prefix) {
  static int n = 0;
  const std::string d = ::testing::TempDir() + "/" + prefix + std::to_string(::getpid()) + "_" + std::to_string(n++);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

nlohmann::json beat(int rank, double updated, bool in_op, double ops, int stage = 0, const char* section = "step") {
  return {{"rank", rank}, {"host", "h" + std::to_string(rank)}, {"updated_unix", updated}, {"in_op", in_op},
          {"ops_done", ops}, {"stage", stage}, {"section", section}, {"step", 7}, {"section_for_s", 200.0},
          {"op", in_op ? "all_reduce on dp (4 ranks, 8 B)" : "none"}};
}

TEST(Watchdog, NamesAFrozenRankByItsStaleHeartbeat) {
  const double now = 1000;
  // Rank 2 last wrote 60 s ago with a 5 s period (fresh means within 3 x 5 + 1 = 16 s).
  std::vector<nlohmann::json> hb = {beat(0, now - 1, true, 40), beat(1, now - 2, true, 40), beat(2, now - 60, false, 38),
                                    beat(3, now - 1, true, 40)};
  const auto c = find_culprits(hb, now, 5);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].rank, 2);
  EXPECT_EQ(c[0].host, "h2");
  EXPECT_NE(c[0].why.find("no heartbeat for 60.0 s"), std::string::npos) << c[0].why;
  // At 15.9 s it still counts as fresh; then nobody stands out but the one computing.
  hb[2] = beat(2, now - 15.9, false, 38);
  const auto d = find_culprits(hb, now, 5);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].rank, 2);
  EXPECT_NE(d[0].why.find("computing in step"), std::string::npos) << d[0].why;
}

TEST(Watchdog, NamesTheRankBehindWhenEveryoneWaits) {
  const double now = 50;
  // Stage 0: ranks 0, 1 (rank 1 finished fewer calls); stage 1: ranks 2, 3 make other
  // calls (fewer in total) and must not be compared with stage 0.
  std::vector<nlohmann::json> hb = {beat(0, now, true, 120, 0), beat(1, now, true, 117, 0), beat(2, now, true, 90, 1),
                                    beat(3, now, true, 90, 1)};
  const auto c = find_culprits(hb, now, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].rank, 1);
  EXPECT_NE(c[0].why.find("117 communicator calls finished, others of its stage up to 120"), std::string::npos);
  // All equal: nobody stands out (a deadlock in the order of calls).
  hb[1] = beat(1, now, true, 120, 0);
  EXPECT_TRUE(find_culprits(hb, now, 1).empty());
  // A missing file is named too.
  hb[3] = nullptr;
  const auto m = find_culprits(hb, now, 1);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].rank, 3);
}

TEST(Watchdog, RefusesBadTimeouts) {
  WatchdogConfig w;
  w.step_s = -1;
  EXPECT_THROW(w.validate(), UserError);
  w = {}, w.auto_factor = 0.5;
  EXPECT_THROW(w.validate(), UserError);
  w = {}, w.heartbeat_s = 0;
  EXPECT_THROW(w.validate(), UserError);
  w = {}, w.save_s = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(w.validate(), UserError);
  w = {};
  EXPECT_NO_THROW(w.validate());
}

// The watchdog firing for real: a child process enters a section with a 0.3 s timeout
// and sleeps; it must end with kExitHang within a few seconds and leave its report.
TEST(Watchdog, EndsAStuckProcessWithItsOwnStatusAndReport) {
  const std::string dir = make_temp_dir("lns_watchdog_");
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    WatchdogConfig w;
    w.eval_s = 0.3, w.heartbeat_s = 0.1, w.run_dir = dir, w.host = "testhost";
    Watchdog dog(w);
    dog.start_heartbeats();
    dog.enter(Section::Eval, 12);
    std::this_thread::sleep_for(std::chrono::seconds(30));
    std::_Exit(0);  // not reached when the watchdog works
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), kExitHang);
  EXPECT_LT(took, 10.0);
  std::ifstream f(dir + "/faults/rank_00000.json");
  ASSERT_TRUE(f) << "no report in " << dir;
  const nlohmann::json r = nlohmann::json::parse(f);
  EXPECT_EQ(r["cause"], "hang");
  EXPECT_EQ(r["section"], "evaluation");
  EXPECT_EQ(r["step"], 12);
  EXPECT_NE(r["report"].get<std::string>().find("made no progress in evaluation (step 12)"), std::string::npos)
      << r["report"];
  EXPECT_TRUE(std::filesystem::exists(dir + "/heartbeats/rank_00000.json"));
}

// A process that keeps entering sections faster than their timeout is left alone, and a
// probe that reports a transport failure ends it with kExitCommFault at once.
TEST(Watchdog, LeavesProgressAloneAndEndsOnAProbeFailure) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    WatchdogConfig w;
    w.step_s = 0.5, w.setup_s = 0.5, w.heartbeat_s = 0.1, w.auto_factor = 0;
    Watchdog dog(w);
    for (int i = 1; i <= 20; ++i) {  // 2 s of steps of 0.1 s
      dog.enter(Section::Step, i);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::atomic<bool> broken{false};
    dog.add_probe([&broken] { return broken ? std::string("NCCL reports remote error") : std::string(); });
    broken = true;
    std::this_thread::sleep_for(std::chrono::seconds(30));
    std::_Exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), kExitCommFault);  // not kExitHang: the steps made progress
}

TEST(Watchdog, AutomaticStepTimeoutFollowsTheMedianAboveTheFloor) {
  WatchdogConfig w;
  w.step_s = 100, w.auto_factor = 10, w.auto_floor_s = 2, w.auto_warmup = 3, w.heartbeat_s = 1;
  Watchdog dog(w);
  dog.enter(Section::Step, 1);
  EXPECT_EQ(dog.timeout(Section::Step), w.setup_s);  // the process's first step: set-up's timeout
  dog.step_done(50);                                  // ... and left out of the median
  dog.enter(Section::Step, 2);
  EXPECT_EQ(dog.timeout(Section::Step), 100);
  dog.step_done(0.1), dog.enter(Section::Step, 3), dog.step_done(0.5), dog.enter(Section::Step, 4);
  EXPECT_EQ(dog.timeout(Section::Step), 100);  // two steps measured, warm-up is three
  dog.step_done(0.3);                          // median of {0.1, 0.5, 0.3} = 0.3: 10 x 0.3 = 3 s
  EXPECT_DOUBLE_EQ(dog.timeout(Section::Step), 3.0);
  dog.step_done(0.01), dog.step_done(0.01), dog.step_done(0.01);  // median 0.1: 1 s, under the floor
  EXPECT_DOUBLE_EQ(dog.timeout(Section::Step), 2.0);
}

TEST(CommActivity, RecordsTheCallInFlightAndTheTimeWaiting) {
  CommActivity a;
  CommOp op;
  op.group = "dp", op.kind = "all_reduce", op.group_size = 4, op.bytes = 3 << 20;
  a.begin(op);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto s = a.snapshot();
  EXPECT_TRUE(s.in_op);
  EXPECT_EQ(CommActivity::describe(s.op), "all_reduce on dp (4 ranks, 3.0 MiB)");
  a.end();
  const auto e = a.snapshot();
  EXPECT_FALSE(e.in_op);
  EXPECT_EQ(e.ops_done, 1);
  EXPECT_GE(e.wait_s, 0.045);
  op.kind = "recv", op.peer = 3, op.group = "world", op.bytes = 100;
  EXPECT_EQ(CommActivity::describe(op), "recv from rank 3 of world (100 B)");
}

TEST(Stragglers, SlowdownAgainstTheMedianOfTheSameStage) {
  // Stage 0: 1.0, 1.1, 2.0 (median 1.1); stage 1: 5.0, 5.0 (median 5); stage 2 alone.
  const std::vector<double> c = {1.0, 1.1, 2.0, 5.0, 5.0, 9.0};
  const std::vector<int> g = {0, 0, 0, 1, 1, 2};
  const auto s = straggler_slowdowns(c, g);
  EXPECT_DOUBLE_EQ(s[0], 1.0 / 1.1);
  EXPECT_DOUBLE_EQ(s[2], 2.0 / 1.1);
  EXPECT_DOUBLE_EQ(s[3], 1.0);
  EXPECT_EQ(s[5], 0.0);  // no peers: never called slow
  // An even group's median is the mean of the middle two: {1, 2, 3, 10} -> 2.5.
  const auto e = straggler_slowdowns({1, 2, 3, 10}, {0, 0, 0, 0});
  EXPECT_DOUBLE_EQ(e[3], 4.0);
}

TEST(Stragglers, NamedOnlyAfterEnoughWindowsInARow) {
  auto grid = ProcessGrid::single();
  StragglerConfig cfg;
  cfg.every = 2, cfg.threshold = 0.2, cfg.windows = 2;
  StragglerDetector d(cfg, *grid);
  d.add_step(1.0, 0.25);
  EXPECT_DOUBLE_EQ(d.last_compute_s(), 0.75);  // the step less the time waiting
  EXPECT_FALSE(d.due(1));
  EXPECT_TRUE(d.due(2));
  const nlohmann::json r = d.end_window(grid->world(), 2);
  EXPECT_DOUBLE_EQ(r["compute_s"]["max"].get<double>(), 0.75);
  EXPECT_TRUE(r["stragglers"].empty());  // one rank has no peers
  StragglerConfig bad = cfg;
  bad.threshold = 0;
  EXPECT_THROW(bad.validate(), UserError);
  bad = cfg, bad.windows = 0;
  EXPECT_THROW(bad.validate(), UserError);
}

TEST(StepGuard, NonFiniteAlwaysSpikesOnlyAfterTheWindow) {
  StepGuard g(3.0, 4);
  EXPECT_NE(g.suspicious(std::nan(""), 1).find("non-finite loss"), std::string::npos);
  EXPECT_NE(g.suspicious(2, std::numeric_limits<double>::infinity()).find("non-finite gradient norm"),
            std::string::npos);
  EXPECT_EQ(g.suspicious(100, 1), "");  // no window yet
  for (double l : {2.0, 2.2, 1.9, 2.1}) g.accept(l, 1.0);
  // Median of {2.0, 2.2, 1.9, 2.1} as nth_element takes it: the upper middle, 2.1.
  EXPECT_EQ(g.suspicious(6.29, 1.0), "");
  EXPECT_NE(g.suspicious(6.31, 1.0).find("loss spike 6.3100 > 3.0 x the running median 2.1000"), std::string::npos);
  EXPECT_NE(g.suspicious(2.0, 3.5).find("gradient norm spike"), std::string::npos);
  g.accept(std::nan(""), 1.0);  // never enters the window
  EXPECT_EQ(g.suspicious(6.29, 1.0), "");
  EXPECT_THROW(StepGuard(1.0, 4), UserError);
  EXPECT_THROW(StepGuard(2.0, 0), UserError);
  StepGuard off(0, 1);
  off.accept(1, 1);
  EXPECT_EQ(off.suspicious(1e9, 1e9), "");
}

TEST(FaultInjection, ParsesAndRefusesSpecs) {
  const auto f = parse_fault_spec("hang@3:rank=1,slow@2:rank=0:factor=2.5,nan@7");
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0].kind, InjectedFault::Kind::Hang);
  EXPECT_EQ(f[0].step, 3);
  EXPECT_EQ(f[0].rank, 1);
  EXPECT_EQ(f[1].factor, 2.5);
  EXPECT_EQ(f[2].kind, InjectedFault::Kind::Nan);
  for (const char* bad : {"hang", "hang@0", "hang@x", "boom@3", "hang@3:rank=-1", "slow@2:factor=0.5",
                          "hang@3:factor=2", "hang@3:rank"}) {
    try {
      parse_fault_spec(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("--inject_fault"), std::string::npos) << e.what();
    }
  }
}

TEST(FaultInjection, BatchFaultsFollowTheBatchAndFlipsFireOnce) {
  FaultInjector inj("nan@3,spike@5,bitflip@2:rank=0,bitflip@2:rank=1", 0, "");
  EXPECT_TRUE(std::isnan(inj.loss_factor(16, 8)));  // step 3 draws samples 16..23
  EXPECT_EQ(inj.loss_factor(24, 8), 1.0);           // the batch after it is clean
  EXPECT_EQ(inj.loss_factor(32, 8), 20.0);
  EXPECT_FALSE(inj.take_bitflip(1));
  EXPECT_TRUE(inj.take_bitflip(2));
  EXPECT_FALSE(inj.take_bitflip(2));  // the re-run of step 2 is clean
  // With a run directory a fault fires once per directory: a restarted run goes past it.
  const std::string dir = make_temp_dir("lns_inject_");
  EXPECT_TRUE(FaultInjector("bitflip@4", 0, dir).take_bitflip(4));
  EXPECT_FALSE(FaultInjector("bitflip@4", 0, dir).take_bitflip(4));
  EXPECT_TRUE(FaultInjector("bitflip@4", 0, dir + "/other").take_bitflip(4));
  // Slowness: from its step on, factor - 1 times the last compute time.
  FaultInjector slow("slow@3:factor=3", 0, "");
  EXPECT_EQ(slow.at_step_start(2, 0.5), 0.0);
  EXPECT_DOUBLE_EQ(slow.at_step_start(3, 0.5), 1.0);
  EXPECT_DOUBLE_EQ(slow.at_step_start(9, 0.25), 0.5);
}

TEST(Fingerprint, ChangesWithOneBitAndTheSeed) {
  std::vector<float> g(1000);
  for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(0.1f * i);
  const uint64_t a = fingerprint_words(g.data(), g.size(), 0);
  EXPECT_EQ(a, fingerprint_words(g.data(), g.size(), 0));
  EXPECT_NE(a, fingerprint_words(g.data(), g.size(), 1));
  for (int bit : {0, 22, 30, 31}) {
    std::vector<float> h = g;
    uint32_t w;
    std::memcpy(&w, &h[517], 4);
    w ^= 1u << bit;
    std::memcpy(&h[517], &w, 4);
    EXPECT_NE(a, fingerprint_words(h.data(), h.size(), 0)) << "bit " << bit;
  }
}

}  // namespace
}  // namespace lns
