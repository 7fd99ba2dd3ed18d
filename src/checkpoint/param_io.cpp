#include "lns/checkpoint/param_io.h"

#include <absl/strings/match.h>

#include <set>

#include "lns/checkpoint/checkpoint.h"
#include "lns/core/errors.h"
#include "lns/model/stage.h"

namespace lns {

bool is_weight_name(const std::string& name) {
  return (absl::StartsWith(name, "model.") || absl::StartsWith(name, "lm_head.")) &&
         !absl::EndsWith(name, ".rotary_emb.inv_freq");
}

void load_params(ParamSet& params, const SafetensorsReader& file, const LlamaConfig& cfg) {
  std::set<std::string> model_names;
  for (const ParamInfo& p : LlamaStage::model_params(cfg)) model_names.insert(p.name);
  for (const auto& [name, e] : file.entries())
    if (is_weight_name(name) && !model_names.count(name))
      fail(file.path(), ": has weight '", name, "' that this model (its --norm_scheme, ",
           "--norm_type, --num_layers, --tie_embeddings) does not have");
  // The file is a source of logical tensors; load_from_source slices each one for
  // this stage / tensor-parallel shard (padding zero).
  struct FileSource : TensorSource {
    const SafetensorsReader& f;
    explicit FileSource(const SafetensorsReader& file) : f(file) {}
    bool has(const std::string& n, const std::string& k) const override { return k == "param" && f.has(n); }
    std::vector<float> logical(const std::string& n, const std::string&) const override { return f.read_f32(n); }
    std::vector<int64_t> logical_shape(const std::string& n) const override { return f.entry(n).shape; }
    std::string where() const override { return f.path(); }
  };
  load_from_source(FileSource(file), params, nullptr);
}

}  // namespace lns
