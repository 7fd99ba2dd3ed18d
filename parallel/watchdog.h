// Watchdog: hang detection on every rank (docs/resilience.md).
//
// The main thread says which section it is in (set-up, a training step, a checkpoint
// save or load, an evaluation) and when it makes progress; a thread of the watchdog
// checks each section's clock against its timeout. On expiry it writes one line on the
// log (the section, the step, what this rank waits for: the communicator call in
// flight from CommActivity, or that it is computing; and which ranks stopped making
// progress, from the heartbeats), records the report in the run directory, aborts the
// communicators that can be aborted (NCCL: ncclCommAbort frees a stuck kernel), and
// ends the process with kExitHang, which ends the job (mpirun and srun stop every rank
// when one exits non-zero).
//
// Heartbeats: the same thread writes OUT_DIR/heartbeats/rank_NNNNN.json every
// heartbeat period (section, step, time of the last progress, the call in flight, the
// calls finished). Another rank reads them without the stuck rank's help: a rank whose
// file stopped changing is frozen or dead (SIGSTOP, a wedged driver, a lost node); a
// rank that computes while the others wait in a call is stuck in its computation; when
// every rank waits in a call, the ranks that finished fewer calls are behind.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace lns {

enum class Section { None, Setup, Step, Save, Load, Eval, kCount };
const char* section_name(Section s);  // "none", "setup", "step", "checkpoint save", ...

struct WatchdogConfig {
  // Timeouts per section, seconds (0: never). The defaults are the NVIDIA Resiliency
  // Extension's as Megatron uses them (set-up 600, step 180, checkpoint 420).
  double setup_s = 600, step_s = 180, save_s = 420, load_s = 600, eval_s = 420;
  // Automatic step timeout: after `auto_warmup` steps, factor x the median step time,
  // never under floor_s (0 factor: off, the fixed step_s holds throughout).
  double auto_factor = 10, auto_floor_s = 60;
  int auto_warmup = 10;
  std::string run_dir;   // heartbeats/ and faults/ go here; "" = none (own report only)
  double heartbeat_s = 5;  // how often this rank's heartbeat file is rewritten
  double grace_s = 10;     // after the abort hooks, how long the main thread may take to exit
  int rank = 0, world = 1;
  int stage = 0;  // pipeline stage: ranks of one stage make the same communicator calls
  std::string host;
  void validate() const;  // UserError naming the flag
};

// Whether a heartbeat record is fresh (its writer's thread still runs) at wall time
// `now`, given the writer's heartbeat period: written within 3 periods + 1 s (slack for
// a slow shared filesystem; the section timeouts are far longer).
bool heartbeat_fresh(const nlohmann::json& hb, double now_unix, double heartbeat_s);

// From every rank's heartbeat (null where a rank has none) at wall time `now`, the
// ranks that stopped making progress and why, one entry each: frozen or dead (stale
// heartbeat), computing while others wait, or behind in calls finished. Pure, for tests.
struct Culprit {
  int rank;
  std::string host, why;
};
std::vector<Culprit> find_culprits(const std::vector<nlohmann::json>& heartbeats, double now_unix,
                                   double heartbeat_s);

class Watchdog {
 public:
  explicit Watchdog(const WatchdogConfig& cfg);
  ~Watchdog();  // stops the thread
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The main thread enters a section (its clock starts now); step is the 1-based step
  // it belongs to (the step being run, or the last one taken). The first step a process
  // runs has the set-up's timeout (first use of every kernel and library plan).
  void enter(Section s, int64_t step);
  // Measured time of a whole training step, for the automatic step timeout (the first
  // step of the process is left out of the median).
  void step_done(double seconds);
  double timeout(Section s) const;
  // The run directory may change from now on (the run was accepted, docs/training.md):
  // heartbeats start, and a report is also written to OUT_DIR/faults/. Before, the
  // watchdog times the sections and reports on the log only.
  void start_heartbeats();
  // Called by the watchdog's thread on expiry before it ends the process (ncclCommAbort).
  void add_abort_hook(std::function<void()> hook);
  // Polled by the watchdog's thread every tick: "" while healthy, else a transport
  // failure (NCCL's async error: a peer died). On one, the same report and abort as a
  // hang, with kExitCommFault: a dead peer ends the job without waiting for a timeout.
  void add_probe(std::function<std::string()> probe);
  // The report the watchdog would write now (tests; the expiry path writes it).
  // failure: a transport failure found by a probe, instead of a timeout.
  std::string report(double section_for_s, const std::string& failure = "") const;
  const WatchdogConfig& config() const { return cfg_; }

 private:
  void loop();
  void write_heartbeat();
  [[noreturn]] void expire(Section s, double for_s, const std::string& failure = "");
  nlohmann::json heartbeat_record() const;

  WatchdogConfig cfg_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  Section section_ = Section::None;
  int64_t step_ = 0;
  int64_t first_step_ = -1;       // the first step this process ran
  double section_start_ = 0;      // monotonic
  double progress_unix_ = 0;      // wall time of the last enter()
  std::vector<double> step_times_;
  std::atomic<bool> beating_{false};  // start_heartbeats() was called
  std::atomic<bool> expiring_{false};  // the thread is ending the process (expire)
  double auto_step_s_ = 0;        // 0 until the warm-up is over
  std::vector<std::function<void()>> hooks_;
  std::vector<std::function<std::string()>> probes_;
  std::thread thread_;
};

}  // namespace lns
