// StepGuard: which step results are suspicious enough to run the step again
// (docs/resilience.md). A non-finite loss or gradient norm always is; so is a loss, or
// a gradient norm, above `spike_factor` x the median of the last `window` accepted
// ones, once that many were seen. The trainer re-runs such a step from the state before it (the same
// batch, the same weights) and compares: the same bits mean the batch is the cause
// (its samples are logged; --skip_bad_batches skips it); other bits mean a transient
// fault, and the ranks whose own gradients differed are named.
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace lns {

class StepGuard {
 public:
  // spike_factor 0: non-finite results only. UserError naming the flags otherwise.
  StepGuard(double spike_factor, int window);
  // "" when the result is unremarkable, else why it is suspicious (one phrase).
  std::string suspicious(double loss, double grad_norm) const;
  void accept(double loss, double grad_norm);  // a step's result that training went on with

 private:
  double factor_;
  size_t window_;
  std::deque<double> losses_, norms_;
};

// A 64-bit fingerprint of a buffer's bits (FNV-1a over 32-bit words, seeded), so that
// two runs of the same step can be compared rank by rank without moving gradients.
uint64_t fingerprint_words(const void* data, int64_t words, uint64_t seed);

}  // namespace lns
