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

#include "lns/checkpoint/checkpoint.h"
#include "lns/model/config.h"
#include "lns/checkpoint/safetensors.h"

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
// "lns_llama_nonorm", the shapes, rope_theta, branch_scales). out_dir as export_hf's.
nlohmann::json folded_config_from(const LlamaConfig& cfg);  // UserError unless cfg.folded_norms
std::vector<std::string> export_folded(const TensorSource& src, const LlamaConfig& cfg, const std::string& out_dir,
                                       bool overwrite = false);

// The LayerNorm-Scaling repository's checkpoints (its peft_pretraining/modeling_llama.py,
// docs/model.md): Hugging Face LLaMA directories whose config.json does not say the
// block variant; the repository reads it from the environment, NORM_TYPE (lower-cased)
// and POST_NUM (default 1). Its parameters carry the names ours do.
//
// `cfg`'s shapes as the model the repository builds under NORM_TYPE=norm_type and
// POST_NUM=post_num (its rotary base is always 10000 and it has no grouped-query
// attention, whatever the config says). UserError naming `what` (the flag or file) for
// a name it does not run as a model: pre_post_pre_post, LNS and unknown names build
// blocks that are the identity (no forward branch).
LlamaConfig config_for_repo_norm_type(LlamaConfig cfg, const std::string& norm_type, int post_num,
                                      const std::string& what);
struct RepoNormType {
  std::string norm_type;  // NORM_TYPE
  int post_num = 1;       // POST_NUM
};
// The NORM_TYPE / POST_NUM under which the repository computes `cfg`, or UserError
// saying why it cannot (LayerNorm, GQA, another rotary base, a scheme it lacks).
RepoNormType repo_norm_type_of(const LlamaConfig& cfg);
// export-repo: config.json (export-hf's, plus "lns_repo_norm_type" / "lns_repo_post_num":
// how to run it there, and what import-hf reads back) and model.safetensors (f32, the
// repository's names; branch scales 0-dim), for the repository's LlamaForCausalLM.
std::vector<std::string> export_repo(const TensorSource& src, const LlamaConfig& cfg, const std::string& out_dir,
                                     const std::string& tokenizer, int max_position_embeddings,
                                     bool overwrite = false);

// A Hugging Face LLaMA directory as a source of logical weights (no optimizer state).
// Opening validates config.json (types, ranges), the index's shard names (plain file
// names in the directory) and that the weights are exactly the config's model with
// the shapes it implies, before anything is allocated for them.
// `repo_norm_type` (non-empty: --repo_norm_type) reads it as the repository's model
// under that NORM_TYPE and POST_NUM = `repo_post_num`; without it, a config.json that
// names them (export-repo's "lns_repo_norm_type") is read so, any other as a plain
// Pre-LN LLaMA.
class HfDirectory : public TensorSource {
 public:
  explicit HfDirectory(const std::string& dir, const std::string& repo_norm_type = "", int repo_post_num = 1);
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
