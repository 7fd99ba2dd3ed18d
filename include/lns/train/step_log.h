// StepLog: what the trainer says about each step, in metrics.jsonl and on the log
// (docs/training.md): the step's record (loss, learning rate, gradient norm, tokens/s,
// MFU, time, the time left, the start-up account after the first step, the bytes sent
// by kind) and, every --log_every steps, the training line with the tokens/s averaged
// since the last one, the time elapsed and the ETA. Rank 0 only; pure formatting, no
// collective.
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace lns {

struct StepStats;
struct StartupTimes;

struct StepLogConfig {
  int64_t steps = 1, log_every = 10;
  int64_t tokens_per_step = 0, flops_per_token = 0;
  double peak_tflops = 0;  // of one device; 0: no MFU
  int world = 1;           // devices, for MFU
};

class StepLog {
 public:
  // start: now_seconds() at the start of the run (the records' elapsed_s).
  StepLog(const StepLogConfig& cfg, double start);
  // The step's metrics record; the caller adds what only it knows (LN-free progress).
  // startup: given for the first step of the run. comm: bytes sent by kind.
  nlohmann::json record(const StepStats& s, double now, const StartupTimes* startup,
                        const std::vector<std::pair<std::string, double>>& comm) const;
  // Adds the step to the window of the training line.
  void add(const StepStats& s);
  // Whether the step prints the training line (every log_every, the first and the last).
  bool line_due(int64_t step) const;
  // The training line, with `extra` (" | ln_free ...") before the time; starts a new window.
  // Ends "| 12.3 s elapsed, ETA 1m23s" (format_duration, lns/core/progress.h).
  std::string line(const StepStats& s, double now, const std::string& extra);
  // Seconds left after `step`: the mean time of the last kEtaSteps steps added (without
  // this process's first step, which pays one-time costs, once others exist) times the
  // steps left to --steps. Evaluations and checkpoint saves are not in it. -1 before any step.
  double eta_seconds(int64_t step) const;
  static constexpr int kEtaSteps = 20;

 private:
  StepLogConfig cfg_;
  double start_;
  double window_time_ = 0;
  int64_t window_tokens_ = 0;
  std::deque<double> recent_;  // the last kEtaSteps step times
  int64_t added_ = 0;
};

}  // namespace lns
