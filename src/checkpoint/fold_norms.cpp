#include "lns/checkpoint/fold_norms.h"

#include <absl/strings/str_cat.h>

#include "lns/model/block_plan.h"
#include "lns/core/errors.h"
#include "lns/model/ln_free.h"
#include "lns/model/stage.h"

namespace lns {
namespace {

std::string layer_tensor(int layer, const std::string& what) {
  return absl::StrCat("model.layers.", layer, ".", what);
}

// The norm behind an LN-free slot, as a user finds it in the checkpoint.
std::string describe(const LlamaConfig& cfg, int layer, DivisorSlot slot) {
  if (slot == DivisorSlot::Final) return "the final norm model.norm";
  const BlockPlan p = block_plan(cfg, layer);
  const SublayerPlan& sub = slot == DivisorSlot::Mlp ? p.mlp : p.attn;
  const char* as = slot == DivisorSlot::AttnQK ? " as q and k see it (attn_qk)"
                   : slot == DivisorSlot::AttnV ? " as v sees it (attn_v)"
                                                : " (mlp)";
  return absl::StrCat("layer ", layer, " ", norm_slot_name(*sub.pre_norm), as);
}

// The source tensor a folded one comes from: lm_head of a tied model is its embedding.
std::string source_name(const Checkpoint& ck, const std::string& name) {
  return name == "lm_head.weight" && ck.config().tie_embeddings ? "model.embed_tokens.weight" : name;
}

}  // namespace

FoldedNorms::FoldedNorms(const Checkpoint& ck) : src_(ck) {
  const LlamaConfig in = ck.config();
  const std::string where = ck.dir();
  LNS_REQUIRE(!in.folded_norms, "fold-norms: ", where, " is already folded (folded_norms in its manifest)");
  LNS_REQUIRE(in.norm_type == NormType::RMSNorm, "fold-norms: ", where,
              " uses --norm_type=layernorm, which is not folded: its bias would add a constant to q/k/v/gate/up/"
              "lm_head, and a LLaMA linear has no bias (only RMSNorm models fold; docs/ln_free.md)");
  for (int l = 0; l < in.num_layers; ++l) {
    const BlockPlan p = block_plan(in, l);
    for (const SublayerPlan* sub : {&p.attn, &p.mlp})
      for (const auto& other : {sub->out_norm, sub->add_norm})
        LNS_REQUIRE(!other, "fold-norms: ", where, ": layer ", l, " runs as --norm_scheme=",
                    norm_scheme_name(p.effective), ", whose ", norm_slot_name(*other),
                    " is not a pre-norm; LN-free fine-tuning replaces pre-norms and the final norm only, so only "
                    "pre-norm schemes fold (pre, lns, scaled_init, scale_res_pre_norm and hybrids of them)");
    LNS_REQUIRE(!p.route, "fold-norms: ", where, ": layer ", l,
                " is a routed block (a post-norm path); only pre-norm schemes fold");
  }
  // Every norm divides by one constant for every row: no live divisor, no position-0
  // or end-of-text case left (LnFreeState::fully_constant, said here norm by norm).
  const LnFreeState& lf = ck.run_state().ln_free;
  const auto slots = ln_free_slots(in);
  for (const auto& [layer, slot] : slots) {
    const FixedNorm* n = lf.find(layer, slot);
    const std::string what = describe(in, layer, slot);
    LNS_REQUIRE(n, "fold-norms: ", where, ": ", what,
                " still divides by its measured RMS; every norm must be replaced by a constant first (lns_train "
                "--ln_free=..., ending with final, drop_eot and drop_pos0)");
    LNS_REQUIRE(!(n->eot && lf.eot_token >= 0), "fold-norms: ", where, ": ", what,
                " still divides end-of-text rows (token ", lf.eot_token,
                ") by its position-0 constant; finish the schedule with drop_eot");
    LNS_REQUIRE(lf.pos0_divisor(*n) == n->rest, "fold-norms: ", where, ": ", what,
                " still divides position 0 by ", n->pos0, " and other positions by ", n->rest,
                "; finish the schedule with drop_pos0");
  }
  LNS_CHECK(lf.fully_constant(slots));

  cfg_ = in;
  cfg_.folded_norms = true;
  cfg_.tie_embeddings = false;
  cfg_.validate();
  const auto divisor = [&](int layer, DivisorSlot slot) { return double(lf.find(layer, slot)->rest); };
  for (int l = 0; l < in.num_layers; ++l) {
    const BlockPlan p = block_plan(in, l);
    const std::string ga = layer_tensor(l, norm_slot_name(*p.attn.pre_norm)) + ".weight",
                      gm = layer_tensor(l, norm_slot_name(*p.mlp.pre_norm)) + ".weight";
    const double sa = p.attn.pre_scale, sm = p.mlp.pre_scale;
    folds_.insert({layer_tensor(l, "self_attn.q_proj.weight"), {ga, sa / divisor(l, DivisorSlot::AttnQK)}});
    folds_.insert({layer_tensor(l, "self_attn.k_proj.weight"), {ga, sa / divisor(l, DivisorSlot::AttnQK)}});
    folds_.insert({layer_tensor(l, "self_attn.v_proj.weight"), {ga, sa / divisor(l, DivisorSlot::AttnV)}});
    folds_.insert({layer_tensor(l, "mlp.gate_proj.weight"), {gm, sm / divisor(l, DivisorSlot::Mlp)}});
    folds_.insert({layer_tensor(l, "mlp.up_proj.weight"), {gm, sm / divisor(l, DivisorSlot::Mlp)}});
  }
  folds_.insert({"lm_head.weight", {"model.norm.weight", 1.0 / divisor(in.num_layers, DivisorSlot::Final)}});

  for (const ParamInfo& p : LlamaStage::model_params(cfg_)) names_.insert(p.name);

  state_ = ck.run_state();
  state_.ln_free = {};
  state_.conversions.push_back(
      {"fold-norms", norm_scheme_name(in.norm_scheme), norm_scheme_name(in.norm_scheme), where,
       absl::StrCat("LN-free norms folded: each pre-norm's gain * depth scale / constant multiplied into the "
                    "columns of q/k/v (attn_qk's and attn_v's constants) and gate/up, model.norm's into lm_head",
                    in.tie_embeddings ? " (untied from the embedding)" : "",
                    "; same function, no norms; the optimizer state was dropped")});
}

bool FoldedNorms::has(const std::string& name, const std::string& kind) const {
  return kind == "param" && names_.count(name) > 0;  // no moments: they belonged to the unfolded weights
}

std::vector<float> FoldedNorms::logical(const std::string& name, const std::string& kind) const {
  LNS_REQUIRE(has(name, kind), src_.where(), ": the folded model has no ", kind, " '", name, "'");
  std::vector<float> w = src_.logical(source_name(src_, name), "param");
  const auto it = folds_.find(name);
  if (it == folds_.end()) return w;
  const Fold* f = &it->second;
  // W'[o, c] = W[o, c] * g[c] * s / d, rounded once from f64.
  const std::vector<float> g = src_.logical(f->gain, "param");
  const size_t C = g.size();
  LNS_CHECK(C > 0 && w.size() % C == 0) << name << " is not [out, " << C << "]";
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(double(w[i]) * double(g[i % C]) * f->factor);
  return w;
}

std::vector<int64_t> FoldedNorms::logical_shape(const std::string& name) const {
  return src_.logical_shape(source_name(src_, name));
}

}  // namespace lns
