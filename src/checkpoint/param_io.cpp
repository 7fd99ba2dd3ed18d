#include "lns/param_io.h"

#include <absl/strings/match.h>

#include "lns/errors.h"

namespace lns {

bool is_weight_name(const std::string& name) {
  return absl::StartsWith(name, "model.") || absl::StartsWith(name, "lm_head.");
}

void load_params(ParamSet& params, const SafetensorsReader& file) {
  for (const auto& [name, e] : file.entries())
    if (is_weight_name(name) && params.find(name) < 0)
      fail(file.path(), ": has weight '", name, "' that this model (its --norm_scheme, ",
           "--norm_type, --num_layers, --tie_embeddings) does not have");
  for (const ParamInfo& info : params.infos()) {
    if (!file.has(info.name)) fail(file.path(), ": missing weight '", info.name, "'");
    file.read_into(info.name, params.param(params.find(info.name)));
  }
}

}  // namespace lns
