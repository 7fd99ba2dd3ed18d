// The flags of fault handling (docs/resilience.md): hang detection, stragglers, the
// re-run of suspicious steps, asynchronous checkpoints, and fault injection for tests.
#include <gflags/gflags.h>

#include "lns/train/resilience_flags.h"

// ---- hang detection (parallel/watchdog.h) -------------------------------------------------
DEFINE_bool(watchdog, true,
            "Hang detection: a thread per rank ends the job (exit status 76) when a section makes no "
            "progress within its timeout, naming what the rank waits for and the ranks that stopped.");
DEFINE_double(timeout_setup_s, 600, "Watchdog: seconds allowed for start-up to the first step (0: none).");
DEFINE_double(timeout_step_s, 180,
              "Watchdog: seconds allowed for one training step until --timeout_step_warmup steps have run "
              "(then the automatic timeout, unless --timeout_step_auto_factor=0).");
DEFINE_double(timeout_step_auto_factor, 10,
              "Watchdog: after the warm-up, the step timeout is this many times the median step time "
              "(never under --timeout_step_floor_s); 0 keeps --timeout_step_s throughout.");
DEFINE_double(timeout_step_floor_s, 60, "Watchdog: the automatic step timeout is never shorter than this.");
DEFINE_int32(timeout_step_warmup, 10, "Watchdog: steps measured before the automatic step timeout applies.");
DEFINE_double(timeout_save_s, 420, "Watchdog: seconds allowed for a checkpoint save (0: none).");
DEFINE_double(timeout_load_s, 600, "Watchdog: seconds allowed for loading a checkpoint at start-up (0: none).");
DEFINE_double(timeout_eval_s, 420, "Watchdog: seconds allowed for one evaluation or diagnostics pass (0: none).");
DEFINE_double(heartbeat_s, 5,
              "Seconds between rewrites of OUT_DIR/heartbeats/rank_N.json, which other ranks read to "
              "name a rank that stopped.");
// ---- stragglers (lns/train/straggler.h) ---------------------------------------------------------
DEFINE_int64(straggler_every, 20,
             "Every N steps, compare each rank's compute time (step time less time waiting on "
             "communication) with its peers'; 0 = off.");
DEFINE_double(straggler_threshold, 0.2,
              "A rank slower than its peers' median by more than this fraction is a straggler candidate.");
DEFINE_int32(straggler_windows, 3, "Name a straggler after this many windows in a row (log and metrics.jsonl).");
// ---- suspicious steps (lns/train/step_guard.h) ----------------------------------------------------
DEFINE_bool(rerun_suspicious_steps, true,
            "Run a step again from the state before it when its loss or gradient norm is non-finite or "
            "the loss spikes: the same result blames the batch, another one a transient fault.");
DEFINE_double(spike_factor, 5,
              "A loss above this many times the running median of --spike_window steps is a spike; 0 = "
              "only non-finite results are suspicious.");
DEFINE_int32(spike_window, 50, "Accepted steps in the running median of --spike_factor.");
DEFINE_bool(skip_bad_batches, false,
            "When the re-run reproduces a suspicious result, skip that batch (draw the next one for the "
            "same step) instead of failing (non-finite) or going on (a finite spike).");
// ---- checkpoints --------------------------------------------------------------------------
DEFINE_bool(async_save, false,
            "Checkpoints are copied to host memory at the step boundary and written by a background "
            "thread while training goes on (at most one save in flight); `latest` moves once every "
            "rank's file is durable.");
// ---- fault injection, for tests (lns/train/fault_injection.h) -------------------------------------
DEFINE_string(inject_fault, "",
              "Tests only: KIND@STEP[:rank=R][:factor=F],... with KIND hang, stop, exit, slow, bitflip, nan, "
              "spike or hang_save (docs/resilience.md). Fires once per --out_dir.");

namespace lns {

WatchdogConfig watchdog_config_from_flags(double stretch) {
  auto timeout = [&](const char* name, double v) {
    return gflags::GetCommandLineFlagInfoOrDie(name).is_default ? v * stretch : v;
  };
  WatchdogConfig w;
  w.setup_s = timeout("timeout_setup_s", FLAGS_timeout_setup_s);
  w.step_s = timeout("timeout_step_s", FLAGS_timeout_step_s);
  w.save_s = timeout("timeout_save_s", FLAGS_timeout_save_s);
  w.load_s = timeout("timeout_load_s", FLAGS_timeout_load_s);
  w.eval_s = timeout("timeout_eval_s", FLAGS_timeout_eval_s);
  w.auto_factor = FLAGS_timeout_step_auto_factor;
  w.auto_floor_s = timeout("timeout_step_floor_s", FLAGS_timeout_step_floor_s);
  w.auto_warmup = FLAGS_timeout_step_warmup;
  w.heartbeat_s = FLAGS_heartbeat_s;
  w.validate();
  return w;
}

bool watchdog_flag() { return FLAGS_watchdog; }

void add_resilience_flags(TrainConfig& c) {
  c.straggler.every = FLAGS_straggler_every;
  c.straggler.threshold = FLAGS_straggler_threshold;
  c.straggler.windows = FLAGS_straggler_windows;
  c.straggler.validate();
  c.rerun_suspicious = FLAGS_rerun_suspicious_steps;
  c.spike_factor = FLAGS_spike_factor;
  c.spike_window = FLAGS_spike_window;
  c.skip_bad_batches = FLAGS_skip_bad_batches;
  c.async_save = FLAGS_async_save;
  c.inject_fault = FLAGS_inject_fault;
}

}  // namespace lns
