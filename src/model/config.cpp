#include "lns/config.h"

#include <nlohmann/json.hpp>
#include <vector>

#include "lns/errors.h"

namespace lns {
namespace {

constexpr std::pair<NormScheme, const char*> kSchemes[] = {
    {NormScheme::Pre, "pre"},           {NormScheme::LNS, "lns"},
    {NormScheme::Post, "post"},         {NormScheme::Mix, "mix"},
    {NormScheme::Sandwich, "sandwich"}, {NormScheme::DeepNorm, "deepnorm"},
    {NormScheme::ScaledInit, "scaled_init"}};

}  // namespace

const char* norm_scheme_name(NormScheme s) {
  for (auto& [k, v] : kSchemes)
    if (k == s) return v;
  return "?";
}

NormScheme parse_norm_scheme(const std::string& s, const std::string& flag) {
  for (auto& [k, v] : kSchemes)
    if (s == v) return k;
  fail(flag, "=", s, " is not a normalization scheme; expected one of pre, lns, post, mix, ",
       "sandwich, deepnorm, scaled_init");
}

const char* norm_type_name(NormType t) { return t == NormType::RMSNorm ? "rmsnorm" : "layernorm"; }

NormType parse_norm_type(const std::string& s, const std::string& flag) {
  if (s == "rmsnorm") return NormType::RMSNorm;
  if (s == "layernorm") return NormType::LayerNorm;
  fail(flag, "=", s, " is not a norm type; expected rmsnorm or layernorm");
}

void LlamaConfig::validate() const {
  auto positive = [](int v, const char* flag) {
    LNS_REQUIRE(v > 0, "--", flag, " must be positive, got ", v);
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_layers, "num_layers");
  positive(num_heads, "num_heads");
  positive(num_kv_heads, "num_kv_heads");
  LNS_REQUIRE(hidden_size % num_heads == 0, "--hidden_size=", hidden_size,
              " must be divisible by --num_heads=", num_heads);
  LNS_REQUIRE(num_heads % num_kv_heads == 0, "--num_heads=", num_heads,
              " must be divisible by --num_kv_heads=", num_kv_heads);
  LNS_REQUIRE(head_dim() % 2 == 0, "head dimension --hidden_size/--num_heads = ", head_dim(),
              " must be even for rotary embeddings");
  LNS_REQUIRE(rope_theta > 0, "--rope_theta must be positive, got ", rope_theta);
  LNS_REQUIRE(norm_eps > 0, "--norm_eps must be positive, got ", norm_eps);
  LNS_REQUIRE(init_std > 0 && embed_init_std > 0,
              "--init_std and --embed_init_std must be positive");
  LNS_REQUIRE(post_layers >= 0 && post_layers <= depth_layers(), "--post_layers=", post_layers,
              " must be in [0, --num_layers=", depth_layers(), "]");
  LNS_REQUIRE(layer_depths.empty() || static_cast<int>(layer_depths.size()) == num_layers,
              "layer_depths has ", layer_depths.size(), " entries for ", num_layers, " layers");
  for (int d : layer_depths)
    LNS_REQUIRE(d >= 0 && d < depth_layers(), "layer depth ", d, " outside [0, ", depth_layers(), ")");
}

nlohmann::json LlamaConfig::to_json() const {
  nlohmann::json j = {{"vocab_size", vocab_size},
          {"hidden_size", hidden_size},
          {"intermediate_size", intermediate_size},
          {"num_layers", num_layers},
          {"num_heads", num_heads},
          {"num_kv_heads", num_kv_heads},
          {"rope_theta", rope_theta},
          {"norm_eps", norm_eps},
          {"norm_type", norm_type_name(norm_type)},
          {"norm_scheme", norm_scheme_name(norm_scheme)},
          {"post_layers", post_layers},
          {"tie_embeddings", tie_embeddings},
          {"init_std", init_std},
          {"embed_init_std", embed_init_std}};
  if (!layer_depths.empty()) j["layer_depths"] = layer_depths;
  if (trained_num_layers > 0) j["trained_num_layers"] = trained_num_layers;
  return j;
}

LlamaConfig LlamaConfig::from_json(const nlohmann::json& j, const std::string& source) {
  LlamaConfig c;
  try {
    auto get = [&](const char* key, auto& field) {
      if (j.contains(key)) field = j.at(key).get<std::remove_reference_t<decltype(field)>>();
    };
    get("vocab_size", c.vocab_size);
    get("hidden_size", c.hidden_size);
    get("intermediate_size", c.intermediate_size);
    get("num_layers", c.num_layers);
    get("num_heads", c.num_heads);
    get("num_kv_heads", c.num_kv_heads);
    get("rope_theta", c.rope_theta);
    get("norm_eps", c.norm_eps);
    get("post_layers", c.post_layers);
    get("tie_embeddings", c.tie_embeddings);
    get("init_std", c.init_std);
    get("embed_init_std", c.embed_init_std);
    get("layer_depths", c.layer_depths);
    get("trained_num_layers", c.trained_num_layers);
    if (j.contains("norm_type"))
      c.norm_type = parse_norm_type(j.at("norm_type").get<std::string>(), source + ": norm_type");
    if (j.contains("norm_scheme"))
      c.norm_scheme =
          parse_norm_scheme(j.at("norm_scheme").get<std::string>(), source + ": norm_scheme");
  } catch (const nlohmann::json::exception& e) {
    fail(source, ": model config is malformed: ", e.what());
  }
  return c;
}

}  // namespace lns
