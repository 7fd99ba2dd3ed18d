// Removing blocks from a trained model. The remaining blocks keep the depth they were
// trained at: their LNS scale 1/sqrt(depth) and their Mix-LN role (post or pre) stay
// what training made them, so the smaller model computes exactly what the full model
// computes with those blocks skipped (the layer-removal study's definition).
#pragma once
#include <set>
#include <string>
#include <vector>

#include "lns/checkpoint/checkpoint.h"
#include "lns/model/config.h"

namespace lns {

struct LayerRemoval {
  LlamaConfig config;     // num_layers reduced, layer_depths = the kept blocks' depths
  std::vector<int> kept;  // new layer i is old layer kept[i]
};

// UserError naming --layers when an index is out of range or nothing would remain.
LayerRemoval plan_layer_removal(const LlamaConfig& cfg, const std::set<int>& drop);
// Parses "3,7" into layer indices (UserError naming the flag).
std::set<int> parse_layer_list(const std::string& list, int num_layers, const std::string& flag);

// The source's tensors under the names of the model with layers removed.
class RemovedLayers : public TensorSource {
 public:
  RemovedLayers(const TensorSource& src, std::vector<int> kept) : src_(src), kept_(std::move(kept)) {}
  bool has(const std::string& n, const std::string& k) const override { return src_.has(old_name(n), k); }
  std::vector<float> logical(const std::string& n, const std::string& k) const override {
    return src_.logical(old_name(n), k);
  }
  std::vector<int64_t> logical_shape(const std::string& n) const override {
    return src_.logical_shape(old_name(n));
  }
  std::string where() const override { return src_.where(); }
  std::string old_name(const std::string& name) const;

 private:
  const TensorSource& src_;
  std::vector<int> kept_;
};

}  // namespace lns
