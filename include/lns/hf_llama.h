// Hugging Face LlamaForCausalLM directories: config translation both ways, reading
// weights (one model.safetensors or an index of several) and writing them.
//
// A plain LLaMA expresses `pre`, `scaled_init` (an init rule only) and `lns` (its
// 1/sqrt(depth) output scale folded into the RMSNorm gains) exactly. `post`, `mix`
// and `deepnorm` normalize after the residual add and `sandwich` normalizes the
// sublayer outputs, which LlamaForCausalLM cannot do; LayerNorm (mean subtraction,
// biases) is not RMSNorm. Those are refused with the reason rather than exported
// into a different model. (Gemma 2 has sandwich norms but also scales embeddings and
// soft-caps logits, so it is no exact target either.)
#pragma once
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "lns/checkpoint.h"
#include "lns/config.h"
#include "lns/safetensors.h"

namespace lns {

// UserError naming the scheme/norm and what would be lost.
void check_hf_exportable(const LlamaConfig& cfg);
nlohmann::json hf_config_from(const LlamaConfig& cfg, int max_position_embeddings);
LlamaConfig config_from_hf(const nlohmann::json& hf, const std::string& path);

// Writes config.json and model.safetensors (f32, LNS scales folded into the gains)
// to out_dir, copying tokenizer files when `tokenizer` names a file or directory.
// Every input is checked before anything is written; the directory is staged and
// moved into place whole. out_dir must not exist or be empty; with `overwrite` it may
// also be an earlier export of ours (its weights' metadata lists its files).
// Returns one line per file written.
std::vector<std::string> export_hf(const TensorSource& src, const LlamaConfig& cfg,
                                   const std::string& out_dir, const std::string& tokenizer,
                                   int max_position_embeddings, bool overwrite = false);

// A model with folded norms (folded_norms, lns_convert fold-norms; docs/ln_free.md) has
// no Hugging Face form: LlamaForCausalLM always normalises. export-folded writes it for
// the small PyTorch model tools/reference/llama_nonorm.py instead: model.safetensors
// (f32, our tensor names) and config.json (folded_config_from: model_type
// "lns_llama_nonorm", the shapes, rope_theta, residual_scales). out_dir as export_hf's.
nlohmann::json folded_config_from(const LlamaConfig& cfg);  // UserError unless cfg.folded_norms
std::vector<std::string> export_folded(const TensorSource& src, const LlamaConfig& cfg, const std::string& out_dir,
                                       bool overwrite = false);

// A Hugging Face LLaMA directory as a source of logical weights (no optimizer state).
// Opening validates config.json (types, ranges), the index's shard names (plain file
// names in the directory) and that the weights are exactly the config's model with
// the shapes it implies, before anything is allocated for them.
class HfDirectory : public TensorSource {
 public:
  explicit HfDirectory(const std::string& dir);
  const LlamaConfig& config() const { return cfg_; }
  bool has(const std::string& name, const std::string& kind) const override;
  std::vector<float> logical(const std::string& name, const std::string& kind) const override;
  std::vector<int64_t> logical_shape(const std::string& name) const override;
  std::string where() const override { return dir_; }

 private:
  std::string dir_;
  LlamaConfig cfg_;
  std::map<std::string, std::string> file_of_;  // tensor -> file
  mutable std::map<std::string, std::unique_ptr<SafetensorsReader>> readers_;
  const SafetensorsReader& reader(const std::string& file) const;
};

}  // namespace lns
