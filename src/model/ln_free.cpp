#include "lns/model/ln_free.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "lns/model/block_plan.h"
#include "lns/model/config.h"
#include "lns/core/errors.h"
#include "lns/core/files.h"
#include "lns/core/json_in.h"
#include "lns/model/stage.h"

namespace lns {
namespace {

constexpr int kMaxEvents = 10000;          // events of one schedule
constexpr size_t kMaxLosses = 100000;      // the loss window
constexpr double kMaxDivisor = 1e30;       // a divisor beyond this is corrupt input
constexpr int64_t kMaxSteps = int64_t{1} << 62;

}  // namespace

const char* divisor_slot_name(DivisorSlot s) {
  switch (s) {
    case DivisorSlot::Mlp: return "mlp";
    case DivisorSlot::AttnQK: return "attn_qk";
    case DivisorSlot::AttnV: return "attn_v";
    case DivisorSlot::Final: return "final";
  }
  return "?";
}

bool parse_divisor_slot(const std::string& name, DivisorSlot* out) {
  for (DivisorSlot s : {DivisorSlot::Mlp, DivisorSlot::AttnQK, DivisorSlot::AttnV, DivisorSlot::Final})
    if (name == divisor_slot_name(s)) {
      *out = s;
      return true;
    }
  return false;
}

std::vector<std::pair<int, DivisorSlot>> ln_free_slots(const LlamaConfig& cfg) {
  std::vector<std::pair<int, DivisorSlot>> out;
  for (int l = 0; l < cfg.num_layers; ++l) {
    const BlockPlan p = block_plan(cfg, l);
    if (p.attn.pre_norm) {
      out.push_back({l, DivisorSlot::AttnQK});
      out.push_back({l, DivisorSlot::AttnV});
    }
    if (p.mlp.pre_norm) out.push_back({l, DivisorSlot::Mlp});
  }
  if (!cfg.folded_norms) out.push_back({cfg.num_layers, DivisorSlot::Final});  // folded: no norm left
  return out;
}

const FixedNorm* LnFreeState::find(int layer, DivisorSlot slot) const {
  for (const FixedNorm& n : norms)
    if (n.layer == layer && n.slot == slot) return &n;
  return nullptr;
}

bool LnFreeState::fully_constant(const std::vector<std::pair<int, DivisorSlot>>& slots) const {
  for (const auto& [layer, slot] : slots) {
    const FixedNorm* n = find(layer, slot);
    if (!n || (n->eot && eot_token >= 0) || pos0_divisor(*n) != n->rest) return false;
  }
  return true;
}

nlohmann::json LnFreeState::to_json() const {
  nlohmann::json ns = nlohmann::json::array();
  // Divisors are f32; as JSON doubles they read back to the same f32 exactly.
  for (const FixedNorm& n : norms)
    ns.push_back({{"layer", n.layer}, {"slot", divisor_slot_name(n.slot)}, {"pos0", double(n.pos0)},
                  {"rest", double(n.rest)}, {"eot", n.eot}, {"step", n.step}});
  const LnFreeProgress& p = progress;
  nlohmann::json sched = {{"text", p.schedule}, {"next_event", p.next_event},
                          {"last_event_step", p.last_event_step},
                          {"recent_losses", p.recent_losses}};
  sched["baseline_loss"] = p.has_baseline ? nlohmann::json(p.baseline_loss) : nlohmann::json(nullptr);
  return {{"version", 1}, {"pos0_special", pos0_special}, {"eot_token", eot_token}, {"norms", ns},
          {"schedule", sched}};
}

LnFreeState LnFreeState::from_json(const JsonIn& j, int num_layers) {
  j.require_object();
  if (j["version"].integer(1, 1000) != 1) j["version"].error("expected 1");
  LnFreeState s;
  s.pos0_special = j["pos0_special"].boolean();
  s.eot_token = static_cast<int32_t>(j["eot_token"].integer(-1, INT32_MAX));
  const JsonIn ns = j["norms"];
  if (ns.size() > size_t{4} * (num_layers + 1)) ns.error("more entries than the model has norms");
  std::set<std::pair<int, int>> seen;
  for (size_t i = 0; i < ns.size(); ++i) {
    const JsonIn e = ns.at(i);
    FixedNorm n;
    const std::string slot = e["slot"].string();
    if (!parse_divisor_slot(slot, &n.slot))
      e["slot"].error("'", printable(slot), "', expected mlp, attn_qk, attn_v or final");
    n.layer = static_cast<int>(e["layer"].integer(0, num_layers));
    if ((n.slot == DivisorSlot::Final) != (n.layer == num_layers))
      e["layer"].error(n.layer, ": the final norm is layer ", num_layers, " (num_layers), every other slot ",
                       "a layer in [0, ", num_layers, ")");
    // Finite, > 0 and small enough for f32: the stage divides by them.
    n.pos0 = static_cast<float>(e["pos0"].number(0, kMaxDivisor));
    n.rest = static_cast<float>(e["rest"].number(0, kMaxDivisor));
    if (!(n.pos0 > 0)) e["pos0"].error("must be > 0");
    if (!(n.rest > 0)) e["rest"].error("must be > 0");
    n.eot = e["eot"].boolean();
    if (n.eot && s.eot_token < 0) e["eot"].error("true, but eot_token is -1 (no end-of-text id)");
    n.step = e["step"].integer(0, kMaxSteps);
    if (!seen.insert({n.layer, static_cast<int>(n.slot)}).second)
      e.error("layer ", n.layer, " ", slot, " is listed twice");
    s.norms.push_back(n);
  }
  const JsonIn p = j["schedule"];
  s.progress.schedule = p["text"].string();
  s.progress.next_event = static_cast<int>(p["next_event"].integer(0, kMaxEvents));
  s.progress.last_event_step = p["last_event_step"].integer(0, kMaxSteps);
  const JsonIn losses = p["recent_losses"];
  if (losses.size() > kMaxLosses) losses.error("more than ", kMaxLosses, " losses");
  for (size_t i = 0; i < losses.size(); ++i) s.progress.recent_losses.push_back(losses.at(i).number(-1e30, 1e30));
  if (!p["baseline_loss"].raw().is_null()) {
    s.progress.has_baseline = true;
    s.progress.baseline_loss = p["baseline_loss"].number(-1e30, 1e30);
  }
  return s;
}

LnFreeState ln_free_for_kept_layers(const LnFreeState& s, const std::vector<int>& kept, int old_num_layers) {
  LnFreeState out = s;
  out.norms.clear();
  out.progress = {};  // the schedule named the old layers; the caller checked it is finished
  for (const FixedNorm& n : s.norms) {
    FixedNorm m = n;
    if (n.layer == old_num_layers) {
      m.layer = static_cast<int>(kept.size());
    } else {
      const auto it = std::find(kept.begin(), kept.end(), n.layer);
      if (it == kept.end()) continue;  // a removed layer's norms go with it
      m.layer = static_cast<int>(it - kept.begin());
    }
    out.norms.push_back(m);
  }
  return out;
}

void apply_ln_free(const LnFreeState& s, LlamaStage& stage) {
  const StageSpec& sp = stage.spec();
  const int L = stage.config().num_layers;
  for (const FixedNorm& n : s.norms) {
    const bool here = n.layer == L ? sp.has_head : sp.holds_layer(n.layer);  // every chunk's layers
    if (!here) continue;
    stage.set_fixed_divisor(n.layer, n.slot, s.pos0_divisor(n), n.rest, n.eot ? s.eot_token : -1);
  }
}

}  // namespace lns
