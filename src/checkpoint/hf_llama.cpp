#include "lns/hf_llama.h"

#include <filesystem>
#include <fstream>
#include <set>

#include <absl/strings/str_format.h>

#include "lns/block_plan.h"
#include "lns/errors.h"
#include "lns/param_io.h"
#include "lns/stage.h"

namespace fs = std::filesystem;

namespace lns {

void check_hf_exportable(const LlamaConfig& cfg) {
  if (cfg.norm_type != NormType::RMSNorm)
    fail("export-hf: LlamaForCausalLM has RMSNorm only; this model uses --norm_type=layernorm ",
         "(mean subtraction and norm biases would be lost)");
  switch (cfg.norm_scheme) {
    case NormScheme::Pre:
    case NormScheme::LNS:
    case NormScheme::ScaledInit:
      return;
    case NormScheme::Post:
    case NormScheme::Mix:
    case NormScheme::DeepNorm:
      fail("export-hf: --norm_scheme=", norm_scheme_name(cfg.norm_scheme),
           " normalizes after the residual add (x = N(alpha*x + F(x))), which LlamaForCausalLM ",
           "cannot express; exporting would silently change the model");
    case NormScheme::Sandwich:
      fail("export-hf: --norm_scheme=sandwich normalizes each sublayer's output ",
           "(post_attention_layernorm, post_feedforward_layernorm), which LlamaForCausalLM lacks; ",
           "Gemma 2 has such norms but also scales embeddings and soft-caps logits, so no exact ",
           "format exists");
  }
}

nlohmann::json hf_config_from(const LlamaConfig& cfg, int max_position_embeddings) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", cfg.vocab_size},
          {"hidden_size", cfg.hidden_size},
          {"intermediate_size", cfg.intermediate_size},
          {"num_hidden_layers", cfg.num_layers},
          {"num_attention_heads", cfg.num_heads},
          {"num_key_value_heads", cfg.num_kv_heads},
          {"head_dim", cfg.head_dim()},
          {"hidden_act", "silu"},
          {"rms_norm_eps", cfg.norm_eps},
          {"rope_theta", cfg.rope_theta},
          {"rope_scaling", nullptr},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"tie_word_embeddings", cfg.tie_embeddings},
          {"max_position_embeddings", max_position_embeddings},
          {"initializer_range", cfg.init_std},
          {"torch_dtype", "float32"}};
}

LlamaConfig config_from_hf(const nlohmann::json& hf, const std::string& path) {
  auto need = [&](const char* key) {
    if (!hf.contains(key)) fail(path, ": config.json has no '", key, "'");
    return hf.at(key);
  };
  const std::string type = hf.value("model_type", "");
  if (type != "llama") fail(path, ": model_type '", type, "' is not 'llama'");
  if (hf.value("hidden_act", "silu") != "silu")
    fail(path, ": hidden_act '", hf.value("hidden_act", ""), "' (only silu, SwiGLU, is supported)");
  if (hf.value("attention_bias", false) || hf.value("mlp_bias", false))
    fail(path, ": linear biases (attention_bias/mlp_bias) are not supported");
  if (hf.contains("rope_scaling") && !hf["rope_scaling"].is_null())
    fail(path, ": rope_scaling ", hf["rope_scaling"].dump(), " is not supported");
  LlamaConfig c;
  c.vocab_size = need("vocab_size");
  c.hidden_size = need("hidden_size");
  c.intermediate_size = need("intermediate_size");
  c.num_layers = need("num_hidden_layers");
  c.num_heads = need("num_attention_heads");
  c.num_kv_heads = hf.value("num_key_value_heads", c.num_heads);
  c.norm_eps = hf.value("rms_norm_eps", 1e-6f);
  c.rope_theta = hf.value("rope_theta", 10000.0);
  c.tie_embeddings = hf.value("tie_word_embeddings", false);
  c.init_std = hf.value("initializer_range", 0.02f);
  c.embed_init_std = c.init_std;
  c.norm_type = NormType::RMSNorm;
  c.norm_scheme = NormScheme::Pre;
  if (hf.contains("head_dim") && hf["head_dim"].get<int>() != c.hidden_size / c.num_heads)
    fail(path, ": head_dim ", hf["head_dim"].get<int>(), " differs from hidden_size / num_attention_heads");
  try {
    c.validate();
  } catch (const UserError& e) {
    fail(path, ": ", e.what());
  }
  return c;
}

std::vector<std::string> export_hf(const TensorSource& src, const LlamaConfig& cfg,
                                   const std::string& out_dir, const std::string& tokenizer,
                                   int max_position_embeddings) {
  check_hf_exportable(cfg);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) fail(out_dir, ": cannot create: ", ec.message());
  SafetensorsWriter w;
  std::vector<std::vector<float>> keep;  // the writer copies; this keeps folded tensors alive
  for (const ParamInfo& p : LlamaStage::model_params(cfg)) {
    std::vector<float> t = src.logical(p.name, "param");
    if (cfg.norm_scheme == NormScheme::LNS && p.layer >= 0 && p.kind == ParamKind::NormGain) {
      // y = s * (xhat * g) = xhat * (s * g): the LNS scale of this block's depth moves
      // into the gain, and the model becomes a plain Pre-LN LLaMA.
      const float s = lns_scale(cfg.depth_of(p.layer));
      for (float& v : t) v *= s;
    }
    w.add_f32(p.name, p.logical.to_vector(), t.data());
  }
  w.set_metadata("format", "pt");
  const std::string weights = out_dir + "/model.safetensors";
  w.write(weights);
  std::ofstream(out_dir + "/config.json") << hf_config_from(cfg, max_position_embeddings).dump(2) << "\n";
  std::vector<std::string> wrote = {
      absl::StrFormat("%s (%d bytes)", weights, static_cast<int64_t>(fs::file_size(weights))),
      out_dir + "/config.json"};
  if (!tokenizer.empty()) {
    if (!fs::exists(tokenizer)) fail("--tokenizer=", tokenizer, ": not found");
    const fs::path from(tokenizer);
    std::vector<fs::path> files;
    if (fs::is_directory(from)) {
      for (const char* n : {"tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                            "special_tokens_map.json"})
        if (fs::exists(from / n)) files.push_back(from / n);
    } else {
      files.push_back(from);
    }
    for (const fs::path& f : files) {
      fs::copy_file(f, fs::path(out_dir) / f.filename(), fs::copy_options::overwrite_existing, ec);
      if (ec) fail(f.string(), ": cannot copy: ", ec.message());
      wrote.push_back((fs::path(out_dir) / f.filename()).string());
    }
  }
  return wrote;
}

HfDirectory::HfDirectory(const std::string& dir) : dir_(dir) {
  const std::string cpath = dir + "/config.json";
  std::ifstream f(cpath);
  if (!f) fail(cpath, ": not found; expected a Hugging Face model directory");
  nlohmann::json hf;
  try {
    hf = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail(cpath, ": not valid JSON (", e.what(), ")");
  }
  cfg_ = config_from_hf(hf, cpath);
  const std::string single = dir + "/model.safetensors", index = dir + "/model.safetensors.index.json";
  if (fs::exists(index)) {
    nlohmann::json idx;
    try {
      idx = nlohmann::json::parse(std::ifstream(index));
      for (auto& [name, file] : idx.at("weight_map").items()) file_of_[name] = dir + "/" + file.get<std::string>();
    } catch (const nlohmann::json::exception& e) {
      fail(index, ": not a safetensors index (", e.what(), ")");
    }
  } else if (fs::exists(single)) {
    for (const auto& [name, e] : reader(single).entries()) file_of_[name] = single;
  } else {
    fail(dir, ": no model.safetensors or model.safetensors.index.json");
  }
  std::set<std::string> ours;
  for (const ParamInfo& p : LlamaStage::model_params(cfg_)) {
    if (!file_of_.count(p.name)) fail(dir, ": missing weight '", p.name, "'");
    ours.insert(p.name);
  }
  for (const auto& [name, file] : file_of_) {
    const bool ignorable = name.find("rotary_emb.inv_freq") != std::string::npos ||
                           (cfg_.tie_embeddings && name == "lm_head.weight");
    if (is_weight_name(name) && !ours.count(name) && !ignorable)
      fail(file, ": has weight '", name, "' that a LLaMA of ", dir, "/config.json does not have");
  }
}

const SafetensorsReader& HfDirectory::reader(const std::string& file) const {
  auto& r = readers_[file];
  if (!r) r = std::make_unique<SafetensorsReader>(file);
  return *r;
}

bool HfDirectory::has(const std::string& name, const std::string& kind) const {
  return kind == "param" && file_of_.count(name) > 0;
}

std::vector<float> HfDirectory::logical(const std::string& name, const std::string& kind) const {
  if (!has(name, kind)) fail(dir_, ": no ", kind, " '", name, "'");
  return reader(file_of_.at(name)).read_f32(name);
}

std::vector<int64_t> HfDirectory::logical_shape(const std::string& name) const {
  if (!file_of_.count(name)) fail(dir_, ": no tensor '", name, "'");
  return reader(file_of_.at(name)).entry(name).shape;
}

}  // namespace lns
