// The --ln_free schedule (docs/ln_free.md): which norms become constant divisors, in
// which order, and when. Parsed once into events (data); the trainer asks due() before
// every step and hands each due event, with the divisors it measured, to
// apply_event(), which is the only code that changes an LnFreeState.
//
//   SCHEDULE := EVENT (',' EVENT)*
//   EVENT    := ACTION '@' TRIGGER
//   ACTION   := GROUP ['[' A ['-' B] ']'] [':eot'] | drop_eot | drop_pos0
//   GROUP    := mlp | attn_qk | attn_v | attn (attn_qk and attn_v) | final | all
//   TRIGGER  := N          after N optimizer steps in total
//             | +N         N steps after the previous event (for the first: after the step
//                          the schedule started at, e.g. the checkpoint a fine-tuning resumes)
//             | ~TOL[/MAX] once the mean loss of the last --ln_free_loss_window steps
//                          since the previous event is within TOL of the baseline (the
//                          mean of the window before the first event), or after MAX steps
//
// e.g. the recipe of the GPT-2 result:
//   mlp@+100,attn_qk@~0.05/200,attn_v:eot@~0.05/200,final@~0.05/200,drop_eot@~0.05/200,drop_pos0@~0.05/200
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lns/model/config.h"
#include "lns/model/ln_free.h"

namespace lns {

struct LnFreeEvent {
  enum class Action { Replace, DropEot, DropPos0 };
  enum class Trigger { AtStep, AfterSteps, LossWithin };
  Action action = Action::Replace;
  std::vector<std::pair<int, DivisorSlot>> norms;  // Replace: resolved against the model
  bool eot = false;                                // Replace with ':eot'
  Trigger trigger = Trigger::AtStep;
  int64_t steps = 0;  // AtStep: total steps; AfterSteps: steps since; LossWithin: cap (0: none)
  double tol = 0;     // LossWithin
  std::string text;   // the entry as written
};

// Parses and checks `text` against the model: every named norm exists in its scheme
// and is replaced once, ':eot' has an end-of-text id, drop_eot follows an ':eot'
// event, the first event is not loss-triggered (nothing to compare with yet).
// UserError naming --ln_free and the entry.
std::vector<LnFreeEvent> parse_ln_free_schedule(const std::string& text, const LlamaConfig& cfg,
                                                int32_t eot_token);

class LnFreeSchedule {
 public:
  // window: --ln_free_loss_window (losses averaged by '~' triggers), >= 1.
  LnFreeSchedule(const std::string& text, const LlamaConfig& cfg, int32_t eot_token, int window);
  const std::vector<LnFreeEvent>& events() const { return events_; }
  int window() const { return window_; }
  // A fresh state for this schedule (nothing fixed yet), started after `start_step` steps.
  LnFreeState initial_state(int64_t start_step = 0) const;
  // Checks that a resumed state belongs to this schedule (same text, event index in
  // range); UserError naming `where` otherwise.
  void check_resumed(const LnFreeState& st, const std::string& where) const;
  // The next event if it is due before the step after `steps_taken`, else null; `why`
  // says which condition fired.
  const LnFreeEvent* due(const LnFreeState& st, int64_t steps_taken, std::string* why = nullptr) const;
  // Records one step's (global, all-reduced) loss in the window.
  void record_loss(LnFreeState& st, double loss) const;

 private:
  std::vector<LnFreeEvent> events_;
  std::string text_;
  int32_t eot_token_;
  int window_;
};

// The state after `e` fired at `steps_taken`: replaced norms get the measured constants
// sum/count of `sums`, drops clear their special case; the schedule moves to the next
// event, the first event sets the baseline, the loss window restarts. Pure.
// Returns the norms `e` replaced. UserError if a measured divisor is not finite and > 0.
std::vector<FixedNorm> apply_event(LnFreeState& st, const LnFreeEvent& e, int64_t steps_taken,
                                   const DivisorSums& sums);

}  // namespace lns
