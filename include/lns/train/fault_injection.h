// Fault injection, for tests (--inject_fault; docs/resilience.md). The faults clusters
// produce, at a chosen rank and step, so that every detector and every recovery path
// runs in CI:
//
//   hang@S[:rank=R]        the rank's main thread stops at the start of step S, computing
//                          (its watchdog thread keeps writing heartbeats)
//   stop@S[:rank=R]        the rank stops whole at step S (SIGSTOP: no heartbeat either)
//   exit@S[:rank=R]        the rank dies at step S (SIGKILL)
//   slow@S[:rank=R][:factor=F]  from step S on, the rank computes F times as long (default 3)
//   bitflip@S[:rank=R]     one bit of the rank's own gradients flips in step S, before any
//                          cross-rank sum, the first time step S runs (a silent data error)
//   nan@S                  the global batch step S draws makes the loss non-finite, every
//                          time it is run (a bad batch)
//   spike@S                the same batch's loss reads 20 x its value, every time (a bad batch)
//   hang_save@S[:rank=R]   the rank stops inside the checkpoint save of step S
//
// Several faults are separated by commas. With --out_dir, a fault fires once per run
// directory (a marker file in OUT_DIR/faults/), so a run restarted on the same command
// line goes past it, as it would past a real fault.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lns {

struct InjectedFault {
  enum class Kind { Hang, Stop, Exit, Slow, BitFlip, Nan, Spike, HangSave };
  Kind kind;
  int64_t step = 0;
  int rank = 0;
  double factor = 3;
  std::string text;  // as given, for logs and the marker's name
};

// UserError naming --inject_fault for a malformed spec.
std::vector<InjectedFault> parse_fault_spec(const std::string& spec);

class FaultInjector {
 public:
  // rank: this process's world rank; run_dir: where markers go ("" = none).
  FaultInjector(const std::string& spec, int rank, const std::string& run_dir);
  bool empty() const { return faults_.empty(); }

  // At the start of step `step` (1-based), before any of its work: hang, stop, exit
  // (each of which does not return), and the slowness: returns the seconds this rank
  // must add to look `factor` times slower, given its last step's compute time.
  double at_step_start(int64_t step, double last_compute_s);
  // Inside a checkpoint save of `step`: hang_save.
  void in_save(int64_t step);
  // True once for bitflip@step on this rank: the caller flips a bit of its gradients.
  bool take_bitflip(int64_t step);
  // The factor the loss of the global batch whose first sample is `first_sample` takes
  // (1, NaN or 20): nan@S and spike@S name the batch step S draws when no batch was
  // skipped before it, first sample (S - 1) x global_batch.
  double loss_factor(uint64_t first_sample, int64_t global_batch) const;

 private:
  bool fire(InjectedFault& f);  // false if its marker says it fired in this run directory already
  std::vector<InjectedFault> faults_;
  std::vector<bool> fired_;
  int rank_;
  std::string run_dir_;
};

}  // namespace lns
