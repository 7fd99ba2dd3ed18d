// LN-free state (docs/ln_free.md): which norm divisors are constants, the constants,
// and where the --ln_free schedule stands. One value, in one place: the trainer
// updates it, a checkpoint stores it (manifest "ln_free", docs/checkpoints.md), a
// resumed run, lns_eval and lns_convert fold-norms read it back, and apply_ln_free()
// is the only code that turns it into the stage's fixed divisors.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lns {

class JsonIn;
class LlamaStage;
struct LlamaConfig;

// A norm as LN-free fine-tuning sees it. The attention pre-norm (input_layernorm) is
// two slots, one for the q/k projections and one for v, which may use different
// divisors; the final norm (model.norm) has layer = num_layers.
enum class DivisorSlot { Mlp, AttnQK, AttnV, Final };
const char* divisor_slot_name(DivisorSlot s);  // "mlp", "attn_qk", "attn_v", "final"
bool parse_divisor_slot(const std::string& name, DivisorSlot* out);

// Divisor sums of one calibration (LlamaStage::add_divisor_sums, indexed globally):
// entry 2*layer + 0 the attention pre-norm, 2*layer + 1 the MLP pre-norm, 2*num_layers
// the final norm; each {sum at position 0, count, sum at positions > 0, count}.
using DivisorSums = std::vector<std::array<double, 4>>;
inline size_t divisor_sums_index(int layer, DivisorSlot slot) {
  return slot == DivisorSlot::Final ? 2 * size_t(layer) : 2 * size_t(layer) + (slot == DivisorSlot::Mlp ? 1 : 0);
}

// The norms of `cfg` that LN-free fine-tuning can fix, as (global layer, slot): each
// layer's pre-norms (attention: attn_qk and attn_v; MLP: mlp) where its scheme has
// them, then (num_layers, final).
std::vector<std::pair<int, DivisorSlot>> ln_free_slots(const LlamaConfig& cfg);

// One norm whose divisor is a constant.
struct FixedNorm {
  int layer = 0;  // global 0-based layer; num_layers for the final norm
  DivisorSlot slot = DivisorSlot::Mlp;
  float pos0 = 1.0f, rest = 1.0f;  // measured divisors at position 0 and at positions > 0
  bool eot = false;                // rows whose token is eot_token also divide by pos0
  int64_t step = 0;                // optimizer steps taken when it was replaced
  bool operator==(const FixedNorm&) const = default;
};

// The progress of the --ln_free schedule (what a resume needs to continue exactly).
struct LnFreeProgress {
  std::string schedule;              // the --ln_free text it runs
  int next_event = 0;                // index of the next event to fire
  int64_t last_event_step = 0;       // steps taken when the last event fired
  bool has_baseline = false;         // baseline_loss is set (at the first event)
  double baseline_loss = 0;          // mean loss of the window before the first event
  std::vector<double> recent_losses; // the last --ln_free_loss_window step losses, oldest first
  bool operator==(const LnFreeProgress&) const = default;
};

struct LnFreeState {
  std::vector<FixedNorm> norms;  // in the order they were replaced
  bool pos0_special = true;      // false after drop_pos0: position 0 divides by `rest` too
  int32_t eot_token = -1;        // the end-of-text id of `eot` norms; -1: none
  LnFreeProgress progress;

  bool empty() const { return norms.empty() && progress.schedule.empty(); }
  // The divisor position 0 (and, for `eot` norms, end-of-text rows) uses now.
  float pos0_divisor(const FixedNorm& n) const { return pos0_special ? n.pos0 : n.rest; }
  // The norm of (layer, slot), or null while it is live.
  const FixedNorm* find(int layer, DivisorSlot slot) const;
  // True when every norm of the model is fixed and position-independent (no position-0
  // or end-of-text case): what lns_convert fold-norms needs. `slots`: the norms the
  // model has, as (layer, slot) pairs (ln_free_slots()).
  bool fully_constant(const std::vector<std::pair<int, DivisorSlot>>& slots) const;

  nlohmann::json to_json() const;
  // Validated read of a manifest's "ln_free" object: UserError naming the file and field.
  static LnFreeState from_json(const JsonIn& j, int num_layers);
  bool operator==(const LnFreeState&) const = default;
};

// The state of a model trimmed to the layers `kept` (new layer i is old layer kept[i],
// lns_convert remove-layers): the kept layers' fixed norms renumbered, the final norm's
// moved to the new num_layers, the schedule's progress dropped (it names the old layers;
// the caller refuses a schedule with events left).
LnFreeState ln_free_for_kept_layers(const LnFreeState& s, const std::vector<int>& kept, int old_num_layers);

// Makes every norm of `s` that lies on `stage` divide by its constants.
void apply_ln_free(const LnFreeState& s, LlamaStage& stage);

}  // namespace lns
