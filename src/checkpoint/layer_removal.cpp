#include "lns/checkpoint/layer_removal.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_split.h>

#include "lns/core/errors.h"

namespace lns {

std::set<int> parse_layer_list(const std::string& list, int num_layers, const std::string& flag) {
  std::set<int> out;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    int l = -1;
    LNS_REQUIRE(absl::SimpleAtoi(part, &l) && l >= 0 && l < num_layers, flag, "=", list,
                ": layer '", part, "' is not in [0, ", num_layers, ")");
    out.insert(l);
  }
  LNS_REQUIRE(!out.empty(), flag, ": name at least one layer");
  return out;
}

LayerRemoval plan_layer_removal(const LlamaConfig& cfg, const std::set<int>& drop) {
  LNS_REQUIRE(static_cast<int>(drop.size()) < cfg.num_layers, "--layers would remove every layer");
  LayerRemoval r;
  r.config = cfg;
  r.config.layer_depths.clear();
  for (int l = 0; l < cfg.num_layers; ++l) {
    if (drop.count(l)) continue;
    r.kept.push_back(l);
    r.config.layer_depths.push_back(cfg.depth_of(l));
  }
  for (int l : drop)
    LNS_REQUIRE(l >= 0 && l < cfg.num_layers, "--layers: layer ", l, " is not in [0, ", cfg.num_layers, ")");
  r.config.num_layers = static_cast<int>(r.kept.size());
  r.config.trained_num_layers = cfg.depth_layers();
  return r;
}

std::string RemovedLayers::old_name(const std::string& name) const {
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return name;
  const size_t dot = name.find('.', prefix.size());
  const int i = std::stoi(name.substr(prefix.size(), dot - prefix.size()));
  return prefix + std::to_string(kept_.at(i)) + name.substr(dot);
}

}  // namespace lns
