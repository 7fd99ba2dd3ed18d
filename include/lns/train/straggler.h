// StragglerDetector: names the ranks that compute slower than their peers
// (docs/resilience.md). Each rank measures, per step, its compute time: the step's
// time less the time it spent inside communicator calls (CommActivity), so a rank that
// waits for a slow peer is not itself called slow. Every `every` steps the ranks'
// compute times over the window are exchanged; a rank whose time exceeds the median of
// its peers by more than `threshold` (0.2: 20%) in `windows` windows in a row is named,
// with its host. Peers are the ranks of the same pipeline stage (they do the same
// work); where a stage has a single rank, every rank of the world.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "parallel/process_grid.h"

namespace lns {

struct StragglerConfig {
  int64_t every = 20;       // steps per window; 0 = off
  double threshold = 0.2;   // slower than the peers' median by more than this fraction
  int windows = 3;          // in this many windows in a row
  void validate() const;    // UserError naming the flag
};

// The decision of one window, from every rank's compute seconds (index = world rank)
// and the peer group of each rank (ranks with the same group id are compared).
// Pure, for tests: returns per rank its slowdown against its peers' median (1.0 = at
// the median; 0 where the group has one member).
std::vector<double> straggler_slowdowns(const std::vector<double>& compute_s, const std::vector<int>& group);

class StragglerDetector {
 public:
  // The host names for the report are gathered at the first window (a collective in
  // the training loop: a constructor must not wait for ranks that may fail to start).
  StragglerDetector(const StragglerConfig& cfg, const ProcessGrid& grid);
  void add_step(double step_s, double wait_s);  // this rank's step
  double last_compute_s() const { return last_compute_; }
  bool due(int64_t step) const { return cfg_.every > 0 && step % cfg_.every == 0; }
  // Collective over the world (at a step where due()): exchanges the window's compute
  // times, updates every rank's streak and logs (rank 0) the ranks named. Returns the
  // metrics record (rank 0; empty elsewhere).
  nlohmann::json end_window(Communicator& world, int64_t step);
  const std::vector<int>& streaks() const { return streak_; }

 private:
  StragglerConfig cfg_;
  int rank_, world_;
  std::vector<int> group_;
  std::vector<std::string> hosts_;
  std::vector<int> streak_;
  double window_compute_ = 0, last_compute_ = 0;
  int64_t window_steps_ = 0;
};

}  // namespace lns
