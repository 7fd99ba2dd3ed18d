#include "lns/param_io.h"

#include <absl/strings/match.h>

#include <set>

#include "lns/errors.h"
#include "lns/stage.h"

namespace lns {

bool is_weight_name(const std::string& name) {
  return absl::StartsWith(name, "model.") || absl::StartsWith(name, "lm_head.");
}

void load_params(ParamSet& params, const SafetensorsReader& file, const LlamaConfig& cfg) {
  std::set<std::string> model_names;
  for (const ParamInfo& p : LlamaStage::model_params(cfg)) model_names.insert(p.name);
  for (const auto& [name, e] : file.entries())
    if (is_weight_name(name) && !model_names.count(name))
      fail(file.path(), ": has weight '", name, "' that this model (its --norm_scheme, ",
           "--norm_type, --num_layers, --tie_embeddings) does not have");
  for (int i = 0; i < params.size(); ++i) {
    const ParamInfo& info = params.info(i);
    if (!file.has(info.name)) fail(file.path(), ": missing weight '", info.name, "'");
    if (info.replicated()) {
      file.read_into(info.name, params.param(i));
      continue;
    }
    // A tensor-parallel shard: the logical tensor's slice, zero on padding.
    const SafetensorEntry& e = file.entry(info.name);
    if (Shape(e.shape) != info.logical)
      fail(file.path(), ": tensor '", info.name, "' has shape ", Shape(e.shape).str(), ", expected ",
           info.logical.str());
    const std::vector<float> full = file.read_f32(info.name);
    float* w = params.param(i).f32();
    const int64_t cols = info.shape[1], lcols = info.logical[1];
    for (int64_t j = 0; j < info.shape.numel(); ++j) {
      int64_t li, lj;
      w[j] = info.to_logical(j / cols, j % cols, &li, &lj) ? full[li * lcols + lj] : 0.0f;
    }
  }
}

}  // namespace lns
