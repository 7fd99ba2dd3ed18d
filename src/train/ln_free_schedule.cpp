#include "lns/train/ln_free_schedule.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_split.h>
#include <absl/strings/match.h>
#include <absl/strings/strip.h>
#include <cmath>
#include <set>

#include "lns/core/errors.h"
#include "lns/core/files.h"

namespace lns {
namespace {

constexpr int64_t kMaxStep = int64_t{1} << 40;
constexpr size_t kMaxEvents = 1000;

[[noreturn]] void bad(const std::string& entry, const std::string& what) {
  fail("--ln_free: '", printable(entry), "': ", what);
}

int64_t parse_count(const std::string& entry, std::string s, const char* what) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(s, &v) || v < 0 || v > kMaxStep)
    bad(entry, absl::StrCat(what, " '", printable(s), "' is not an integer in [0, ", kMaxStep, "]"));
  return v;
}

// GROUP['[' A['-' B] ']'] -> the model's norms of that group in those layers.
std::vector<std::pair<int, DivisorSlot>> resolve(const std::string& entry, std::string action,
                                                 const LlamaConfig& cfg) {
  std::string group = action;
  int lo = 0, hi = cfg.num_layers - 1;
  bool ranged = false;
  if (const size_t b = action.find('['); b != std::string::npos) {
    if (action.back() != ']') bad(entry, "a layer range is written [A] or [A-B], at the end of the group");
    group = action.substr(0, b);
    const std::string range = action.substr(b + 1, action.size() - b - 2);
    const std::vector<std::string> ab = absl::StrSplit(range, '-');
    if (ab.size() > 2 || ab[0].empty()) bad(entry, "a layer range is written [A] or [A-B]");
    lo = static_cast<int>(std::min<int64_t>(parse_count(entry, ab[0], "layer"), INT32_MAX));
    hi = ab.size() == 2 ? static_cast<int>(std::min<int64_t>(parse_count(entry, ab[1], "layer"), INT32_MAX)) : lo;
    if (lo > hi || hi >= cfg.num_layers)
      bad(entry, absl::StrCat("layers ", lo, "-", hi, " are not a range inside [0, ", cfg.num_layers - 1, "]"));
    ranged = true;
  }
  std::vector<DivisorSlot> slots;
  if (group == "mlp") slots = {DivisorSlot::Mlp};
  else if (group == "attn_qk") slots = {DivisorSlot::AttnQK};
  else if (group == "attn_v") slots = {DivisorSlot::AttnV};
  else if (group == "attn") slots = {DivisorSlot::AttnQK, DivisorSlot::AttnV};
  else if (group == "final") slots = {DivisorSlot::Final};
  else if (group == "all") slots = {DivisorSlot::Mlp, DivisorSlot::AttnQK, DivisorSlot::AttnV, DivisorSlot::Final};
  else
    bad(entry, absl::StrCat("unknown group '", printable(group),
                            "', expected mlp, attn_qk, attn_v, attn, final, all, drop_eot or drop_pos0"));
  if (ranged && group == "final") bad(entry, "the final norm takes no layer range");
  const auto have = ln_free_slots(cfg);
  std::vector<std::pair<int, DivisorSlot>> out;
  for (const auto& [layer, slot] : have) {
    if (std::find(slots.begin(), slots.end(), slot) == slots.end()) continue;
    if (slot != DivisorSlot::Final && (layer < lo || layer > hi)) continue;
    out.push_back({layer, slot});
  }
  if (ranged)  // a range names layers that must have the norm
    for (int l = lo; l <= hi; ++l)
      for (DivisorSlot s : slots)
        if (s != DivisorSlot::Final && std::find(have.begin(), have.end(), std::make_pair(l, s)) == have.end())
          bad(entry, absl::StrCat("layer ", l, " has no ", s == DivisorSlot::Mlp ? "MLP" : "attention",
                                  " pre-norm in scheme ", norm_scheme_name(cfg.norm_scheme)));
  if (out.empty())
    bad(entry, absl::StrCat("no layer has that pre-norm in scheme ", norm_scheme_name(cfg.norm_scheme)));
  return out;
}

}  // namespace

std::vector<LnFreeEvent> parse_ln_free_schedule(const std::string& text, const LlamaConfig& cfg,
                                                int32_t eot_token) {
  std::vector<LnFreeEvent> events;
  std::set<std::pair<int, DivisorSlot>> replaced;
  bool any_eot = false;
  for (const std::string& raw : std::vector<std::string>(absl::StrSplit(text, ','))) {
    const std::string entry(absl::StripAsciiWhitespace(raw));
    if (entry.empty()) fail("--ln_free: empty entry in '", printable(text), "' (entries are separated by one comma)");
    if (events.size() == kMaxEvents) fail("--ln_free: more than ", kMaxEvents, " events");
    const size_t at = entry.rfind('@');
    if (at == std::string::npos)
      bad(entry, "expected ACTION@TRIGGER, e.g. mlp@100, attn_qk@+50 or final@~0.05/200");
    LnFreeEvent e;
    e.text = entry;
    std::string action = entry.substr(0, at);
    const std::string trig = entry.substr(at + 1);
    if (trig.empty()) bad(entry, "empty trigger after '@'");
    if (trig[0] == '+') {
      e.trigger = LnFreeEvent::Trigger::AfterSteps;
      e.steps = parse_count(entry, trig.substr(1), "step count");
    } else if (trig[0] == '~') {
      e.trigger = LnFreeEvent::Trigger::LossWithin;
      const std::vector<std::string> tm = absl::StrSplit(trig.substr(1), '/');
      if (tm.size() > 2) bad(entry, "a loss trigger is ~TOL or ~TOL/MAX_STEPS");
      if (!absl::SimpleAtod(tm[0], &e.tol) || !std::isfinite(e.tol) || e.tol < 0 || e.tol > 1e6)
        bad(entry, absl::StrCat("loss tolerance '", printable(tm[0]), "' is not a number in [0, 1e6]"));
      if (tm.size() == 2) {
        e.steps = parse_count(entry, tm[1], "step cap");
        if (e.steps == 0) bad(entry, "the step cap after '/' must be > 0");
      }
      if (events.empty())
        bad(entry, "the first event cannot wait for the loss (there is no baseline before it); give it a step");
    } else {
      e.trigger = LnFreeEvent::Trigger::AtStep;
      e.steps = parse_count(entry, trig, "step");
    }
    if (action == "drop_eot") {
      if (!any_eot) bad(entry, "no earlier event has the end-of-text case (':eot') to drop");
      e.action = LnFreeEvent::Action::DropEot;
    } else if (action == "drop_pos0") {
      e.action = LnFreeEvent::Action::DropPos0;
    } else {
      if (absl::EndsWith(action, ":eot")) {
        action.resize(action.size() - 4);
        if (eot_token < 0) bad(entry, "':eot' needs --ln_free_eot_token (the end-of-text token id)");
        e.eot = any_eot = true;
      }
      e.norms = resolve(entry, action, cfg);
      for (const auto& n : e.norms)
        if (!replaced.insert(n).second)
          bad(entry, absl::StrCat(n.second == DivisorSlot::Final ? "the final norm" : absl::StrCat("layer ", n.first, " ", divisor_slot_name(n.second)),
                                  " is already replaced by an earlier event"));
    }
    events.push_back(std::move(e));
  }
  return events;
}

LnFreeSchedule::LnFreeSchedule(const std::string& text, const LlamaConfig& cfg, int32_t eot_token, int window)
    : events_(parse_ln_free_schedule(text, cfg, eot_token)), text_(text), eot_token_(eot_token), window_(window) {
  LNS_REQUIRE(window >= 1 && window <= 100000, "--ln_free_loss_window must be in [1, 100000], got ", window);
}

LnFreeState LnFreeSchedule::initial_state(int64_t start_step) const {
  LnFreeState st;
  st.progress.last_event_step = start_step;
  st.eot_token = eot_token_;
  st.progress.schedule = text_;
  return st;
}

void LnFreeSchedule::check_resumed(const LnFreeState& st, const std::string& where) const {
  if (st.progress.schedule != text_)
    fail(where, ": ln_free.schedule.text is '", printable(st.progress.schedule), "' but --ln_free is '",
         printable(text_), "' (a run continues the schedule it started with)");
  if (st.progress.next_event > static_cast<int>(events_.size()))
    fail(where, ": ln_free.schedule.next_event ", st.progress.next_event, " is past the schedule's ",
         events_.size(), " events");
  if (st.eot_token != eot_token_)
    fail(where, ": ln_free.eot_token is ", st.eot_token, " but --ln_free_eot_token is ", eot_token_);
}

const LnFreeEvent* LnFreeSchedule::due(const LnFreeState& st, int64_t steps_taken, std::string* why) const {
  const LnFreeProgress& p = st.progress;
  if (p.next_event >= static_cast<int>(events_.size())) return nullptr;
  const LnFreeEvent& e = events_[p.next_event];
  const int64_t since = steps_taken - p.last_event_step;
  std::string reason;
  switch (e.trigger) {
    case LnFreeEvent::Trigger::AtStep:
      if (steps_taken < e.steps) return nullptr;
      reason = absl::StrCat("step ", steps_taken, " reached");
      break;
    case LnFreeEvent::Trigger::AfterSteps:
      if (since < e.steps) return nullptr;
      reason = absl::StrCat(since, " steps since the previous event");
      break;
    case LnFreeEvent::Trigger::LossWithin: {
      const auto& w = p.recent_losses;
      double mean = 0;
      for (double l : w) mean += l;
      mean = w.empty() ? 0 : mean / w.size();
      if (static_cast<int>(w.size()) >= window_ && p.has_baseline && mean <= p.baseline_loss + e.tol) {
        reason = absl::StrCat("mean loss ", mean, " of the last ", w.size(), " steps within ", e.tol,
                              " of the baseline ", p.baseline_loss);
      } else if (e.steps > 0 && since >= e.steps) {
        reason = absl::StrCat("loss ", mean, " not within ", e.tol, " of the baseline ", p.baseline_loss,
                              " after the cap of ", e.steps, " steps");
      } else {
        return nullptr;
      }
      break;
    }
  }
  if (why) *why = reason;
  return &e;
}

void LnFreeSchedule::record_loss(LnFreeState& st, double loss) const {
  auto& w = st.progress.recent_losses;
  w.push_back(loss);
  if (static_cast<int>(w.size()) > window_) w.erase(w.begin());
}

std::vector<FixedNorm> apply_event(LnFreeState& st, const LnFreeEvent& e, int64_t steps_taken,
                                   const DivisorSums& sums) {
  LnFreeProgress& p = st.progress;
  if (!p.has_baseline) {  // the first event: the loss to recover is the one before it
    p.has_baseline = true;
    double mean = 0;
    for (double l : p.recent_losses) mean += l;
    p.baseline_loss = p.recent_losses.empty() ? 0 : mean / p.recent_losses.size();
  }
  std::vector<FixedNorm> replaced;
  switch (e.action) {
    case LnFreeEvent::Action::Replace:
      for (const auto& [layer, slot] : e.norms) {
        const size_t i = divisor_sums_index(layer, slot);
        LNS_CHECK(i < sums.size()) << "calibration sums do not cover layer " << layer;
        const auto& s = sums[i];
        FixedNorm n;
        n.layer = layer, n.slot = slot, n.eot = e.eot, n.step = steps_taken;
        n.pos0 = static_cast<float>(s[1] > 0 ? s[0] / s[1] : 0.0);
        n.rest = static_cast<float>(s[3] > 0 ? s[2] / s[3] : 0.0);
        LNS_REQUIRE(std::isfinite(n.pos0) && std::isfinite(n.rest) && n.pos0 > 0 && n.rest > 0,
                    "--ln_free: '", e.text, "': the divisors measured for layer ", layer, " ",
                    divisor_slot_name(slot), " are ", n.pos0, " and ", n.rest,
                    " (need finite and > 0; position 0 and positions > 0 each need calibration rows: "
                    "--seq_len >= 2 and --ln_free_calib_tokens > 0)");
        st.norms.push_back(n);
        replaced.push_back(n);
      }
      break;
    case LnFreeEvent::Action::DropEot:
      for (FixedNorm& n : st.norms) n.eot = false;
      break;
    case LnFreeEvent::Action::DropPos0:
      st.pos0_special = false;
      break;
  }
  ++p.next_event;
  p.last_event_step = steps_taken;
  p.recent_losses.clear();
  return replaced;
}

}  // namespace lns
