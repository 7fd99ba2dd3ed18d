// Every layer's BlockPlan as JSON (lns_train --print_block_plan): the one account of the
// schemes that tools outside C++ read (tools/perf/block_plan.py), so that they never count
// a scheme's norms, scales or residuals again.
#include <nlohmann/json.hpp>

#include "lns/model/block_plan.h"

namespace lns {
namespace {

nlohmann::json slot_json(const std::optional<NormSlot>& s) {
  return s ? nlohmann::json(norm_slot_name(*s)) : nlohmann::json(nullptr);
}

nlohmann::json sublayer_json(const SublayerPlan& p) {
  return {{"pre_norm", slot_json(p.pre_norm)},
          {"pre_scale", p.pre_scale},
          {"out_norm", slot_json(p.out_norm)},
          {"residual_alpha", p.residual_alpha},
          {"learned_branch_scale", p.learned_branch_scale},
          {"add_norm", slot_json(p.add_norm)}};
}

}  // namespace

nlohmann::json block_plans_json(const LlamaConfig& cfg) {
  nlohmann::json layers = nlohmann::json::array();
  for (int g = 0; g < cfg.num_layers; ++g) {
    const BlockPlan p = block_plan(cfg, g);
    nlohmann::json norms = nlohmann::json::array();
    for (const NormSlot s : p.norms()) norms.push_back(norm_slot_name(s));
    layers.push_back({{"layer", g},
                      {"depth", cfg.depth_of(g)},
                      {"scheme", norm_scheme_name(p.effective)},
                      {"norms", norms},
                      {"attn", sublayer_json(p.attn)},
                      {"mlp", sublayer_json(p.mlp)},
                      {"route", p.route ? nlohmann::json{{"attn", sublayer_json(p.route->attn)},
                                                         {"mlp", sublayer_json(p.route->mlp)}}
                                        : nlohmann::json(nullptr)}});
  }
  return {{"norm_scheme", norm_scheme_name(cfg.norm_scheme)},
          {"num_layers", cfg.num_layers},
          {"post_layers", cfg.post_layers},
          {"layer_schemes", cfg.layer_schemes},
          {"folded_norms", cfg.folded_norms},
          {"layers", layers}};
}

}  // namespace lns
