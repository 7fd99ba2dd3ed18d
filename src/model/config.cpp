#include "lns/model/config.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "lns/model/block_plan.h"
#include "lns/core/errors.h"
#include "lns/core/files.h"
#include "absl/strings/str_join.h"
#include "lns/core/json_in.h"
#include "lns/model/layer_schemes.h"

namespace lns {
namespace {

constexpr std::pair<NormScheme, const char*> kSchemes[] = {
    {NormScheme::Pre, "pre"},           {NormScheme::LNS, "lns"},
    {NormScheme::Post, "post"},         {NormScheme::Mix, "mix"},
    {NormScheme::Sandwich, "sandwich"}, {NormScheme::DeepNorm, "deepnorm"},
    {NormScheme::ScaledInit, "scaled_init"}, {NormScheme::DeepPost, "deeppost"},
    {NormScheme::ScalePostPre, "scale_post_pre"}, {NormScheme::Hybrid, "hybrid"},
    {NormScheme::ScaleResPre, "scale_res_pre_norm"}, {NormScheme::Routed, "routed"},
    {NormScheme::Mono, "mono"}, {NormScheme::MonoReverse, "mono_reverse"},
    {NormScheme::DeepPostCorrected, "deeppost_corrected"},
    {NormScheme::MonoReverseCorrected, "mono_reverse_corrected"}};

}  // namespace

const char* norm_scheme_name(NormScheme s) {
  for (auto& [k, v] : kSchemes)
    if (k == s) return v;
  return "?";
}

std::vector<std::string> norm_scheme_names() {
  std::vector<std::string> out;
  for (auto& [k, v] : kSchemes) out.push_back(v);
  return out;
}

NormScheme parse_norm_scheme(const std::string& s, const std::string& flag) {
  for (auto& [k, v] : kSchemes)
    if (s == v) return k;
  fail(flag, "=", printable(s), " is not a normalization scheme; expected one of ",
       absl::StrJoin(norm_scheme_names(), ", "));
}

const char* norm_type_name(NormType t) { return t == NormType::RMSNorm ? "rmsnorm" : "layernorm"; }

NormType parse_norm_type(const std::string& s, const std::string& flag) {
  if (s == "rmsnorm") return NormType::RMSNorm;
  if (s == "layernorm") return NormType::LayerNorm;
  fail(flag, "=", printable(s), " is not a norm type; expected rmsnorm or layernorm");
}

void LlamaConfig::validate() const {
  auto positive = [](int64_t v, int64_t cap, const char* flag) {
    LNS_REQUIRE(v > 0, "--", flag, " must be positive, got ", v);
    LNS_REQUIRE(v <= cap, "--", flag, "=", v, " is larger than the supported ", cap);
  };
  // Each dimension first, so that the products below cannot overflow int64.
  positive(vocab_size, kMaxModelDim, "vocab_size");
  positive(hidden_size, kMaxModelDim, "hidden_size");
  positive(intermediate_size, kMaxModelDim, "intermediate_size");
  positive(num_layers, kMaxLayers, "num_layers");
  positive(num_heads, kMaxModelDim, "num_heads");
  positive(num_kv_heads, kMaxModelDim, "num_kv_heads");
  LNS_REQUIRE(hidden_size % num_heads == 0, "--hidden_size=", hidden_size,
              " must be divisible by --num_heads=", num_heads);
  LNS_REQUIRE(num_heads % num_kv_heads == 0, "--num_heads=", num_heads,
              " must be divisible by --num_kv_heads=", num_kv_heads);
  LNS_REQUIRE(head_dim() % 2 == 0, "head dimension --hidden_size/--num_heads = ", head_dim(),
              " must be even for rotary embeddings");
  const int64_t C = hidden_size, F = intermediate_size, V = vocab_size;
  auto matrix = [&](int64_t rows, int64_t cols, const char* what) {
    LNS_REQUIRE(rows * cols <= kMaxTensorElements, what, " has ", rows, " x ", cols,
                " elements, more than the supported ", kMaxTensorElements, " per tensor");
  };
  matrix(V, C, "the embedding (--vocab_size x --hidden_size)");
  matrix(F, C, "an MLP matrix (--intermediate_size x --hidden_size)");
  matrix(C, C, "an attention matrix (--hidden_size x --hidden_size)");
  const int64_t per_layer = 2 * C * C + 2 * C * int64_t{kv_dim()} + 3 * C * F + 8 * C;
  const int64_t total = int64_t{num_layers} * per_layer + 2 * V * C + 2 * C;
  LNS_REQUIRE(total <= kMaxModelParams, "the model would have ", total,
              " parameters, more than the supported ", kMaxModelParams);
  LNS_REQUIRE(std::isfinite(rope_theta) && rope_theta > 0, "--rope_theta must be positive, got ", rope_theta);
  LNS_REQUIRE(std::isfinite(norm_eps) && norm_eps > 0, "--norm_eps must be positive, got ", norm_eps);
  LNS_REQUIRE(std::isfinite(init_std) && init_std > 0 && std::isfinite(embed_init_std) && embed_init_std > 0,
              "--init_std and --embed_init_std must be positive");
  LNS_REQUIRE(trained_num_layers == 0 || (trained_num_layers >= num_layers && trained_num_layers <= kMaxLayers),
              "trained_num_layers=", trained_num_layers, " must be 0 or in [--num_layers=", num_layers, ", ",
              kMaxLayers, "]");
  LNS_REQUIRE(post_layers >= 0 && post_layers <= depth_layers(), "--post_layers=", post_layers,
              " must be in [0, --num_layers=", depth_layers(), "]");
  LNS_REQUIRE(layer_depths.empty() || static_cast<int>(layer_depths.size()) == num_layers,
              "layer_depths has ", layer_depths.size(), " entries for ", num_layers, " layers");
  for (int d : layer_depths)
    LNS_REQUIRE(d >= 0 && d < depth_layers(), "layer depth ", d, " outside [0, ", depth_layers(), ")");
  LNS_REQUIRE(recompute_layers >= 0 && recompute_layers <= num_layers, "--recompute_layers=",
              recompute_layers, " must be in [0, --num_layers=", num_layers, "]");
  fp8_scaling.validate("--fp8_");
  LNS_REQUIRE(recompute_layers == 0 || recompute == RecomputeMode::Full, "--recompute_layers=",
              recompute_layers, " needs --recompute=full (got ", recompute_mode_name(recompute), ")");
  if (folded_norms) {
    LNS_REQUIRE(norm_type == NormType::RMSNorm, "--folded_norms needs --norm_type=rmsnorm (a folded LayerNorm would ",
                "need biases in the linears it feeds; docs/ln_free.md)");
    LNS_REQUIRE(!tie_embeddings, "--folded_norms needs --tie_embeddings=false (the final norm is folded into "
                "lm_head, which then differs from the embedding)");
  }
  if (norm_scheme == NormScheme::Hybrid)
    resolve_layer_schemes(layer_schemes, depth_layers());  // throws on a bad pattern
  else
    LNS_REQUIRE(layer_schemes.empty(), "--layer_schemes=", printable(layer_schemes),
                " needs --norm_scheme=hybrid (got ", norm_scheme_name(norm_scheme), ")");
  if (folded_norms)  // only pre-norms were folded: no block may keep a norm of another kind
    for (int l = 0; l < num_layers; ++l) {
      const BlockPlan p = block_plan(*this, l);
      LNS_REQUIRE(!p.route && !p.attn.out_norm && !p.mlp.out_norm && !p.attn.add_norm && !p.mlp.add_norm,
                  "--folded_norms: layer ", l, " of --norm_scheme=", norm_scheme_name(norm_scheme), " runs as ",
                  norm_scheme_name(p.effective), ", which has norms other than pre-norms; only pre-norm schemes fold");
    }
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
  if (!layer_schemes.empty()) j["layer_schemes"] = layer_schemes;
  if (folded_norms) j["folded_norms"] = true;  // absent: the norms are there (every older file)
  return j;
}

LlamaConfig LlamaConfig::from_json(const nlohmann::json& j, const std::string& source) {
  // Every field type- and range-checked (naming it), then the model as a whole.
  const JsonIn in(j, source, "");
  in.require_object();
  LlamaConfig c;
  auto integer = [&](const char* key, int& field, int64_t lo, int64_t hi) {
    if (in.has(key)) field = static_cast<int>(in[key].integer(lo, hi));
  };
  integer("vocab_size", c.vocab_size, 1, kMaxModelDim);
  integer("hidden_size", c.hidden_size, 1, kMaxModelDim);
  integer("intermediate_size", c.intermediate_size, 1, kMaxModelDim);
  integer("num_layers", c.num_layers, 1, kMaxLayers);
  integer("num_heads", c.num_heads, 1, kMaxModelDim);
  integer("num_kv_heads", c.num_kv_heads, 1, kMaxModelDim);
  integer("post_layers", c.post_layers, 0, kMaxLayers);
  integer("trained_num_layers", c.trained_num_layers, 0, kMaxLayers);
  if (in.has("rope_theta")) c.rope_theta = in["rope_theta"].number(1e-30, 1e30);
  if (in.has("norm_eps")) c.norm_eps = static_cast<float>(in["norm_eps"].number(1e-30, 1.0));
  if (in.has("init_std")) c.init_std = static_cast<float>(in["init_std"].number(1e-30, 1e3));
  if (in.has("embed_init_std")) c.embed_init_std = static_cast<float>(in["embed_init_std"].number(1e-30, 1e3));
  if (in.has("tie_embeddings")) c.tie_embeddings = in["tie_embeddings"].boolean();
  if (in.has("layer_depths")) {
    for (int64_t d : in["layer_depths"].integers(0, kMaxLayers, 0, kMaxLayers - 1))
      c.layer_depths.push_back(static_cast<int>(d));
  }
  if (in.has("folded_norms")) c.folded_norms = in["folded_norms"].boolean();
  if (in.has("layer_schemes")) c.layer_schemes = in["layer_schemes"].string();
  if (in.has("norm_type")) c.norm_type = parse_norm_type(in["norm_type"].string(), source + ": norm_type");
  if (in.has("norm_scheme"))
    c.norm_scheme = parse_norm_scheme(in["norm_scheme"].string(), source + ": norm_scheme");
  try {
    c.validate();
  } catch (const UserError& e) {
    fail(source, ": ", e.what());
  }
  return c;
}

}  // namespace lns
