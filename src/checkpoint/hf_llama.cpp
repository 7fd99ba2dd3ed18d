#include "lns/checkpoint/hf_llama.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>

#include "lns/model/block_plan.h"
#include "lns/core/errors.h"
#include "lns/core/files.h"
#include "lns/core/json_in.h"
#include "lns/core/output_dir.h"
#include "lns/checkpoint/param_io.h"
#include "lns/model/stage.h"

namespace fs = std::filesystem;

namespace lns {

void check_hf_exportable(const LlamaConfig& cfg) {
  if (cfg.folded_norms)
    fail("export-hf: the model's norms are folded into its linears (folded_norms); a Hugging Face LLaMA always ",
         "normalises (RMSNorm before every sublayer and the head), so it cannot express this model; use ",
         "lns_convert export-folded (tools/reference/llama_nonorm.py loads it)");
  if (cfg.norm_type != NormType::RMSNorm)
    fail("export-hf: LlamaForCausalLM has RMSNorm only; this model uses --norm_type=layernorm ",
         "(mean subtraction and norm biases would be lost)");
  // What LlamaForCausalLM computes is one block plan: a norm before each sublayer (the
  // LNS scale folds into its gain), nothing after it, a plain residual. Each layer's plan
  // (block_plan, the one place that knows a scheme) is held to it, so a new scheme needs
  // no case here.
  const std::string scheme = norm_scheme_name(cfg.norm_scheme);
  const bool hybrid = cfg.norm_scheme == NormScheme::Hybrid;
  // A routed layer first: its path 0 may be post-norm, and the route is what to name.
  for (int i = 0; i < cfg.num_layers; ++i)
    if (block_plan(cfg, i).route)
      fail("export-hf: --norm_scheme=", scheme, hybrid ? absl::StrCat(" layer ", i, " is routed; it") : "",
           " routes blocks between a pre- and a post-norm path with a learned gate, which ",
           "LlamaForCausalLM cannot express");
  for (int i = 0; i < cfg.num_layers; ++i) {
    const BlockPlan b = block_plan(cfg, i);
    const std::string where = absl::StrCat("export-hf: --norm_scheme=", scheme, hybrid ? absl::StrCat(" layer ", i) : "");
    for (const SublayerPlan* sl : {&b.attn, &b.mlp}) {
      if (sl->add_norm || sl->residual_alpha != 1.0f)
        fail(where, " normalizes after the residual add (x = N(alpha*x + F(x))), which LlamaForCausalLM ",
             "cannot express; exporting would silently change the model");
      if (sl->out_norm)
        fail(where, " normalizes each sublayer's output (post_attention_layernorm, post_feedforward_layernorm), ",
             "which LlamaForCausalLM lacks; Gemma 2 has such norms but also scales embeddings and soft-caps ",
             "logits, so no exact format exists");
      if (sl->learned_branch_scale)
        fail(where, " multiplies each sublayer's output by a learned scale, which LlamaForCausalLM cannot ",
             "express (export-repo writes it for the reference repository's model)");
      if (!sl->pre_norm)
        fail(where, " has a sublayer without a norm before it, which LlamaForCausalLM cannot express");
    }
  }
}

// The model's sizes under Hugging Face LlamaConfig's names: both exports (export-hf and
// export-folded) write them, and llama_nonorm.py reads them under the same names.
static nlohmann::json hf_size_keys(const LlamaConfig& cfg) {
  return {{"vocab_size", cfg.vocab_size},
          {"hidden_size", cfg.hidden_size},
          {"intermediate_size", cfg.intermediate_size},
          {"num_hidden_layers", cfg.num_layers},
          {"num_attention_heads", cfg.num_heads},
          {"num_key_value_heads", cfg.num_kv_heads},
          {"rope_theta", cfg.rope_theta},
          {"torch_dtype", "float32"}};
}

nlohmann::json hf_config_from(const LlamaConfig& cfg, int max_position_embeddings) {
  nlohmann::json hf = hf_size_keys(cfg);
  hf.update({{"architectures", {"LlamaForCausalLM"}},
             {"model_type", "llama"},
             {"head_dim", cfg.head_dim()},
             {"hidden_act", "silu"},
             {"rms_norm_eps", cfg.norm_eps},
             {"rope_scaling", nullptr},
             {"attention_bias", false},
             {"mlp_bias", false},
             {"tie_word_embeddings", cfg.tie_embeddings},
             {"max_position_embeddings", max_position_embeddings},
             {"initializer_range", cfg.init_std}});
  return hf;
}

LlamaConfig config_from_hf(const nlohmann::json& hf, const std::string& path) {
  const JsonIn in(hf, path);
  in.require_object();
  const std::string type = in.has("model_type") ? in["model_type"].string() : "";
  if (type != "llama") fail(path, ": model_type '", printable(type), "' is not 'llama'");
  if (in.has("hidden_act") && in["hidden_act"].string() != "silu")
    fail(path, ": hidden_act '", printable(in["hidden_act"].string()), "' (only silu, SwiGLU, is supported)");
  if ((in.has("attention_bias") && in["attention_bias"].boolean()) || (in.has("mlp_bias") && in["mlp_bias"].boolean()))
    fail(path, ": linear biases (attention_bias/mlp_bias) are not supported");
  if (in.has("rope_scaling") && !hf["rope_scaling"].is_null())
    fail(path, ": rope_scaling ", printable(hf["rope_scaling"].dump()), " is not supported");
  LlamaConfig c;
  auto dim = [&](const char* key) { return static_cast<int>(in[key].integer(1, kMaxModelDim)); };
  c.vocab_size = dim("vocab_size");
  c.hidden_size = dim("hidden_size");
  c.intermediate_size = dim("intermediate_size");
  c.num_layers = static_cast<int>(in["num_hidden_layers"].integer(1, kMaxLayers));
  c.num_heads = dim("num_attention_heads");
  c.num_kv_heads = in.has("num_key_value_heads") ? dim("num_key_value_heads") : c.num_heads;
  c.norm_eps = in.has("rms_norm_eps") ? static_cast<float>(in["rms_norm_eps"].number(1e-30, 1)) : 1e-6f;
  c.rope_theta = in.has("rope_theta") ? in["rope_theta"].number(1e-30, 1e30) : 10000.0;
  c.tie_embeddings = in.has("tie_word_embeddings") && in["tie_word_embeddings"].boolean();
  c.init_std = in.has("initializer_range") ? static_cast<float>(in["initializer_range"].number(1e-30, 1e3)) : 0.02f;
  c.embed_init_std = c.init_std;
  c.norm_type = NormType::RMSNorm;
  c.norm_scheme = NormScheme::Pre;
  try {
    c.validate();
  } catch (const UserError& e) {
    fail(path, ": ", e.what());
  }
  // After validate(): num_heads > 0.
  if (in.has("head_dim") && in["head_dim"].integer(1, kMaxModelDim) != c.head_dim())
    fail(path, ": head_dim ", in["head_dim"].integer(1, kMaxModelDim),
         " differs from hidden_size / num_attention_heads = ", c.head_dim());
  return c;
}

namespace {

// The scale block_plan puts on the output of norm gain `p`: its sublayer's pre_scale
// when p is that sublayer's pre-norm, else 1 (embedding, head, final and other norms).
float pre_norm_scale(const LlamaConfig& cfg, const ParamInfo& p) {
  if (p.layer < 0 || p.kind != ParamKind::NormGain) return 1.0f;
  const BlockPlan plan = block_plan(cfg, p.layer);
  for (const SublayerPlan* sub : {&plan.attn, &plan.mlp})
    if (sub->pre_norm && p.name == absl::StrCat("model.layers.", p.layer, ".", norm_slot_name(*sub->pre_norm),
                                                ".weight"))
      return sub->pre_scale;
  return 1.0f;
}

constexpr const char* kExportMarker = "lns_export_files";
// export-repo's config.json: the repository's NORM_TYPE and POST_NUM for the model.
constexpr const char* kRepoNormTypeKey = "lns_repo_norm_type";
constexpr const char* kRepoPostNumKey = "lns_repo_post_num";
const char* const kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                                       "special_tokens_map.json"};

// The tokenizer files --tokenizer names, each checked readable (before anything is written).
std::vector<fs::path> tokenizer_files(const std::string& tokenizer) {
  std::vector<fs::path> files;
  if (tokenizer.empty()) return files;
  const fs::path from(tokenizer);
  std::error_code ec;
  if (!fs::exists(from, ec)) fail("--tokenizer=", tokenizer, ": not found");
  if (fs::is_directory(from, ec)) {
    for (const char* n : kTokenizerFiles)
      if (fs::exists(from / n)) files.push_back(from / n);
    if (files.empty())
      fail("--tokenizer=", tokenizer, ": the directory holds none of tokenizer.json, tokenizer_config.json, ",
           "tokenizer.model, special_tokens_map.json");
  } else {
    files.push_back(from);
  }
  for (const fs::path& f : files) {
    if (!fs::is_regular_file(f, ec)) fail("--tokenizer=", tokenizer, ": ", f.string(), " is not a regular file");
    if (!std::ifstream(f, std::ios::binary)) fail("--tokenizer=", tokenizer, ": cannot read ", f.string());
    if (f.filename() == "config.json" || f.filename() == "model.safetensors")
      fail("--tokenizer=", tokenizer, ": a tokenizer file may not be called ", f.filename().string());
  }
  return files;
}

// For --overwrite: an export-hf output lists its files in its weights' metadata.
std::optional<std::set<std::string>> hf_export_inventory(const std::string& dir, std::string* why) {
  const std::string weights = dir + "/model.safetensors";
  try {
    if (!fs::exists(weights)) throw UserError("no model.safetensors");
    const SafetensorsReader r(weights);
    const auto it = r.metadata().find(kExportMarker);
    if (it == r.metadata().end()) throw UserError(weights + " was not written by lns_convert export-hf or export-folded");
    std::set<std::string> names;
    const std::vector<std::string> listed = absl::StrSplit(it->second, ',', absl::SkipEmpty());
    for (const std::string& n : listed) {
      if (!is_plain_file_name(n)) throw UserError(weights + ": lists '" + printable(n) + "' as an exported file");
      names.insert(n);
    }
    return names;
  } catch (const UserError& e) {
    *why = e.what();
    return std::nullopt;
  }
}

}  // namespace

namespace {

// The weights of `cfg` (f32, LNS scales folded into the pre-norm gains), `config` as
// config.json and the tokenizer files, staged and moved into place whole.
// rope_buffers: also each layer's "self_attn.rotary_emb.inv_freq" [head_dim / 2], which
// the reference repository's model keeps as a saved buffer and its training script's
// strict load_state_dict requires: 1 / 10000^(2j / head_dim), rounded once to f32 (its
// own float32 computation may differ in the last bit).
std::vector<std::string> write_export(const TensorSource& src, const LlamaConfig& cfg, const std::string& out_dir,
                                      const nlohmann::json& config, const std::vector<fs::path>& tok_files,
                                      bool overwrite, const std::string& what, bool rope_buffers = false) {
  StagedDir out(out_dir, "--out", overwrite, hf_export_inventory, what);
  std::vector<std::string> names = {"model.safetensors", "config.json"};
  for (const fs::path& f : tok_files) names.push_back(f.filename().string());
  SafetensorsWriter w;
  for (const ParamInfo& p : LlamaStage::model_params(cfg)) {
    std::vector<float> t = src.logical(p.name, "param");
    // y = s * (xhat * g) = xhat * (s * g): a scaled pre-norm's scale (LNS: 1/sqrt of
    // the block's depth) moves into its gain, and the model becomes a plain Pre-LN LLaMA.
    if (const float s = pre_norm_scale(cfg, p); s != 1.0f)
      for (float& v : t) v *= s;
    w.add_f32(p.name, p.file_shape().to_vector(), t.data());
  }
  if (rope_buffers) {
    const int D = cfg.head_dim();
    std::vector<float> inv_freq(D / 2);
    for (int j = 0; j < D / 2; ++j) inv_freq[j] = static_cast<float>(1.0 / std::pow(cfg.rope_theta, 2.0 * j / D));
    for (int l = 0; l < cfg.num_layers; ++l)
      w.add_f32(absl::StrCat("model.layers.", l, ".self_attn.rotary_emb.inv_freq"), {D / 2}, inv_freq.data());
  }
  w.set_metadata("format", "pt");
  w.set_metadata(kExportMarker, absl::StrJoin(names, ","));
  w.write(out.path() + "/model.safetensors");
  write_file_atomically(out.path() + "/config.json", config.dump(2) + "\n");
  for (const fs::path& f : tok_files) {
    std::error_code ec;
    fs::copy_file(f, fs::path(out.path()) / f.filename(), ec);
    if (ec) fail(f.string(), ": cannot copy: ", ec.message());
  }
  out.commit();
  const std::string weights = out_dir + "/model.safetensors";
  std::vector<std::string> wrote = {
      absl::StrFormat("%s (%d bytes)", weights, static_cast<int64_t>(fs::file_size(weights))),
      out_dir + "/config.json"};
  for (const fs::path& f : tok_files) wrote.push_back((fs::path(out_dir) / f.filename()).string());
  return wrote;
}

}  // namespace

std::vector<std::string> export_hf(const TensorSource& src, const LlamaConfig& cfg,
                                   const std::string& out_dir, const std::string& tokenizer,
                                   int max_position_embeddings, bool overwrite) {
  // Every input first: nothing is written before all of them are known to be good.
  check_hf_exportable(cfg);
  LNS_REQUIRE(max_position_embeddings > 0, "--max_position_embeddings must be positive, got ",
              max_position_embeddings);
  return write_export(src, cfg, out_dir, hf_config_from(cfg, max_position_embeddings), tokenizer_files(tokenizer),
                      overwrite, "a Hugging Face export of lns_convert");
}

nlohmann::json folded_config_from(const LlamaConfig& cfg) {
  LNS_REQUIRE(cfg.folded_norms, "export-folded: the model has norms (no folded_norms in its manifest); fold them ",
              "first with lns_convert fold-norms, or use export-hf");
  bool branch_scales = false;  // scale_res_pre_norm layers: r = x + b * F(x), b learned
  for (int l = 0; l < cfg.num_layers; ++l)
    branch_scales = branch_scales || block_plan(cfg, l).attn.learned_branch_scale;
  nlohmann::json folded = hf_size_keys(cfg);
  folded.update({{"model_type", "lns_llama_nonorm"},
                 {"branch_scales", branch_scales},
                 {"norm_scheme", norm_scheme_name(cfg.norm_scheme)}});
  return folded;
}

std::vector<std::string> export_folded(const TensorSource& src, const LlamaConfig& cfg, const std::string& out_dir,
                                       bool overwrite) {
  return write_export(src, cfg, out_dir, folded_config_from(cfg), {}, overwrite, "an export-folded output of lns_convert");
}

// ---- the reference repository's variants --------------------------------------------

LlamaConfig config_for_repo_norm_type(LlamaConfig cfg, const std::string& norm_type, int post_num,
                                      const std::string& what) {
  LNS_REQUIRE(post_num >= 0 && post_num <= kMaxLayers, what, ": POST_NUM ", post_num, " must be in [0, ", kMaxLayers,
              "]");
  std::string n = norm_type;  // the repository lower-cases NORM_TYPE (modeling_llama.py line 265)
  for (char& ch : n) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const int L = cfg.num_layers;
  // What its model computes, whatever config.json says: RMSNorm, rotary base 10000,
  // as many key/value heads as query heads.
  cfg.norm_type = NormType::RMSNorm;
  cfg.rope_theta = 10000.0;
  cfg.num_kv_heads = cfg.num_heads;
  cfg.layer_schemes.clear();
  cfg.post_layers = std::min(post_num, L);  // POST_NUM >= L: every layer Post-LN there too
  // pre_post / pre_sandwich: the first 7 layers Pre-LN (a fixed 7 in the repository).
  const auto first_seven_pre = [&](const char* rest) {
    if (L <= 7) {
      cfg.norm_scheme = NormScheme::Pre;
    } else {
      cfg.norm_scheme = NormScheme::Hybrid;
      cfg.layer_schemes = std::string("pre:7,") + rest;
    }
  };
  if (n == "pre") cfg.norm_scheme = NormScheme::Pre;
  else if (n == "scale_pre") cfg.norm_scheme = NormScheme::ScaledInit;
  else if (n == "post") cfg.norm_scheme = NormScheme::Post;
  else if (n == "deeppost") cfg.norm_scheme = NormScheme::DeepPost;
  else if (n == "sandwich") cfg.norm_scheme = NormScheme::Sandwich;
  else if (n == "post_pre") cfg.norm_scheme = NormScheme::Mix;
  else if (n == "scale_post_pre") cfg.norm_scheme = NormScheme::ScalePostPre;
  else if (n == "scale_res_pre_norm") cfg.norm_scheme = NormScheme::ScaleResPre;
  else if (n == "mono") cfg.norm_scheme = NormScheme::Mono;
  else if (n == "mono_reverse") cfg.norm_scheme = NormScheme::MonoReverse;
  else if (n == "pre_post") first_seven_pre("post");
  else if (n == "pre_sandwich") first_seven_pre("sandwich");
  else if (n == "post_pre_post_pre") cfg.norm_scheme = NormScheme::Hybrid, cfg.layer_schemes = "post:3,pre,*";
  else if (n == "pre_post_pre_post" || n == "lns")
    fail(what, ": NORM_TYPE '", printable(norm_type), "' has no forward branch in the repository's model (",
         n == "lns" ? "its switch compares the lower-cased name with 'LNS'" : "no case in LlamaDecoderLayer.forward",
         "): it stops with an UnboundLocalError under use_cache, else every block is the identity; lns does not "
         "run that model (docs/model.md: ",
         n == "lns" ? "--norm_scheme=lns is the paper's LNS"
                    : "--layer_schemes=pre:3,post,* is the pattern its norms are built for",
         ")");
  else
    fail(what, ": NORM_TYPE '", printable(norm_type),
         "' is not one the repository runs; expected pre, scale_pre, post, ",
         "deeppost, sandwich, post_pre, scale_post_pre, scale_res_pre_norm, mono, mono_reverse, pre_post, ",
         "pre_sandwich or post_pre_post_pre");
  try {
    cfg.validate();
  } catch (const UserError& e) {
    fail(what, ": ", e.what());
  }
  return cfg;
}

RepoNormType repo_norm_type_of(const LlamaConfig& cfg) {
  constexpr const char* refuse = "export-repo: the reference repository's model cannot compute this one: ";
  if (cfg.norm_type != NormType::RMSNorm) fail(refuse, "it has RMSNorm only (--norm_type=layernorm)");
  if (cfg.folded_norms) fail(refuse, "its blocks always normalise (the norms are folded away: folded_norms)");
  if (cfg.num_kv_heads != cfg.num_heads)
    fail(refuse, "it has no grouped-query attention (--num_kv_heads != --num_heads)");
  if (cfg.rope_theta != 10000.0) fail(refuse, "its rotary base is always 10000 (--rope_theta)");
  if (!cfg.layer_depths.empty())
    fail(refuse, "it has no way to say that the layers keep the depths they were trained at (layers were removed)");
  switch (cfg.norm_scheme) {
    case NormScheme::Pre: return {"pre", 1};
    case NormScheme::ScaledInit: return {"scale_pre", 1};
    case NormScheme::Post: return {"post", 1};
    case NormScheme::DeepPost: return {"deeppost", 1};
    case NormScheme::Sandwich: return {"sandwich", 1};
    case NormScheme::Mix: return {"post_pre", cfg.post_layers};
    case NormScheme::ScalePostPre: return {"scale_post_pre", cfg.post_layers};
    case NormScheme::ScaleResPre: return {"scale_res_pre_norm", 1};
    case NormScheme::Mono: return {"mono", 1};
    case NormScheme::MonoReverse: return {"mono_reverse", 1};
    case NormScheme::Hybrid:
      // A hybrid is exported when its layers run the pattern of one of the repository's.
      for (const char* name : {"pre_post", "pre_sandwich", "post_pre_post_pre"}) {
        const LlamaConfig theirs = config_for_repo_norm_type(cfg, name, 1, "export-repo");
        bool same = true;
        for (int i = 0; i < cfg.num_layers && same; ++i)
          same = block_plan(theirs, i).effective == block_plan(cfg, i).effective;
        if (same) return {name, 1};
      }
      fail(refuse, "--layer_schemes=", cfg.layer_schemes,
           " is none of its hybrids (pre_post: pre:7,post; pre_sandwich: pre:7,sandwich; post_pre_post_pre: ",
           "post:3,pre,*)");
    case NormScheme::LNS:
      fail(refuse, "its LNS switch is never taken (its blocks are then the identity, docs/model.md); ",
           "export-hf folds the LNS scales into the gains, and the repository runs that model as NORM_TYPE=pre");
    case NormScheme::DeepNorm:
    case NormScheme::Routed:
    case NormScheme::DeepPostCorrected:
    case NormScheme::MonoReverseCorrected:
      fail(refuse, "it has no --norm_scheme=", norm_scheme_name(cfg.norm_scheme));
  }
  fail(refuse, "unknown scheme");
}

std::vector<std::string> export_repo(const TensorSource& src, const LlamaConfig& cfg, const std::string& out_dir,
                                     const std::string& tokenizer, int max_position_embeddings, bool overwrite) {
  const RepoNormType r = repo_norm_type_of(cfg);
  LNS_REQUIRE(max_position_embeddings > 0, "--max_position_embeddings must be positive, got ",
              max_position_embeddings);
  nlohmann::json config = hf_config_from(cfg, max_position_embeddings);
  config.erase("num_key_value_heads");  // the repository's attention has none
  config[kRepoNormTypeKey] = r.norm_type;
  config[kRepoPostNumKey] = r.post_num;
  return write_export(src, cfg, out_dir, config, tokenizer_files(tokenizer), overwrite,
                      "an export-repo output of lns_convert", /*rope_buffers=*/true);
}

HfDirectory::HfDirectory(const std::string& dir, const std::string& repo_norm_type, int repo_post_num) : dir_(dir) {
  const std::string cpath = dir + "/config.json";
  if (!fs::exists(cpath)) fail(cpath, ": not found; expected a Hugging Face model directory");
  const nlohmann::json hf = parse_json_file(cpath, 16 << 20, "Hugging Face config");
  cfg_ = config_from_hf(hf, cpath);
  // The repository's variant: the flag, or what export-repo wrote into config.json.
  const JsonIn in(hf, cpath);
  if (in.has(kRepoNormTypeKey)) {
    const std::string named = in[kRepoNormTypeKey].string();
    const int post_num = in.has(kRepoPostNumKey) ? static_cast<int>(in[kRepoPostNumKey].integer(0, kMaxLayers)) : 1;
    if (!repo_norm_type.empty() && (named != repo_norm_type || post_num != repo_post_num))
      fail("--repo_norm_type=", printable(repo_norm_type), " --repo_post_num=", repo_post_num, " contradicts ", cpath,
           ", which says ", kRepoNormTypeKey, " '", printable(named), "', ", kRepoPostNumKey, " ", post_num,
           "; drop the flags");
    cfg_ = config_for_repo_norm_type(cfg_, named, post_num, cpath + " " + kRepoNormTypeKey);
  } else if (!repo_norm_type.empty()) {
    cfg_ = config_for_repo_norm_type(cfg_, repo_norm_type, repo_post_num, "--repo_norm_type");
  }
  const std::string single = dir + "/model.safetensors", index = dir + "/model.safetensors.index.json";
  if (fs::exists(index)) {
    const nlohmann::json idx = parse_json_file(index, 256 << 20, "safetensors index");
    const JsonIn map = JsonIn(idx, index)["weight_map"];
    map.require_object();
    for (auto& [name, file] : map.raw().items()) {
      const JsonIn f(file, index, "weight_map['" + printable(name, 60) + "']");
      const std::string fname = f.string();
      if (!is_plain_file_name(fname))
        f.error("'", printable(fname), "' is not a plain file name inside ", dir);
      file_of_[name] = dir + "/" + fname;
    }
  } else if (fs::exists(single)) {
    for (const auto& [name, e] : reader(single).entries()) file_of_[name] = single;
  } else {
    fail(dir, ": no model.safetensors or model.safetensors.index.json");
  }
  // The weights are exactly those of the config's model, with the shapes it implies,
  // before anything is allocated for them.
  std::set<std::string> ours;
  for (const ParamInfo& p : LlamaStage::model_params(cfg_)) {
    if (!file_of_.count(p.name)) fail(dir, ": missing weight '", p.name, "'");
    const SafetensorEntry& e = reader(file_of_.at(p.name)).entry(p.name);
    if (!p.takes_file_shape(Shape(e.shape)) || !is_float_dtype(e.dtype))
      fail(file_of_.at(p.name), ": weight '", p.name, "' is ", e.dtype, " ", Shape(e.shape).str(), ", ", cpath,
           " implies a float tensor of ", p.logical.str());
    ours.insert(p.name);
  }
  for (const auto& [name, file] : file_of_) {
    const bool ignorable = cfg_.tie_embeddings && name == "lm_head.weight";
    if (is_weight_name(name) && !ours.count(name) && !ignorable)
      fail(file, ": has weight '", printable(name), "' that a LLaMA of ", dir, "/config.json does not have",
           repo_norm_type.empty() && !in.has(kRepoNormTypeKey)
               ? " (a checkpoint of the LayerNorm-Scaling repository's model? name its NORM_TYPE with --repo_norm_type)"
               : "");
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
