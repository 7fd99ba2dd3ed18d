// lns_convert's operations, through the library functions the tool calls: round
// trips are exact where they must be, layer removal equals skipping blocks, and what
// cannot be converted is refused with the reason.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "lns/model/block_plan.h"
#include "lns/checkpoint/checkpoint.h"
#include "lns/core/errors.h"
#include "lns/checkpoint/hf_llama.h"
#include "lns/checkpoint/layer_removal.h"
#include "lns/train/trainer.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace lns {
namespace {

using namespace lns::test;

std::string dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/lns_cv_" + std::to_string(::getpid()) + "_" + name;
  fs::remove_all(d);
  return d;
}

// A trained checkpoint: 2 steps, so the moments are not zero.
std::string trained(const LlamaConfig& c, const std::string& name) {
  TrainConfig t;
  t.data = "random", t.seq_len = 8, t.micro_batch = 2, t.global_batch = 4, t.steps = 2;
  t.out_dir = dir(name);
  Trainer tr(c, t);
  tr.train_step();
  tr.train_step();
  return tr.save_checkpoint();
}
std::string trained(NormScheme s, const std::string& name) { return trained(small_model(s), name); }

TEST(Convert, ReshardThenMergeEqualsMerge) {
  const Checkpoint ck(trained(NormScheme::LNS, "rs"));
  const std::string merged = dir("merged"), resharded = dir("resharded"), remerged = dir("remerged");
  Layout many;
  many.tp = 2, many.pp = 2, many.dp = 2, many.zero = true;
  write_checkpoint_from_source(ck, ck.config(), Layout{}, "", ck.run_state(), AdamWConfig{}, 2, merged);
  write_checkpoint_from_source(ck, ck.config(), many, "3,2", ck.run_state(), AdamWConfig{}, 2, resharded);
  const Checkpoint r(resharded);
  EXPECT_EQ(r.layout().tp, 2);
  EXPECT_EQ(r.manifest()["files"].size(), 8u);
  write_checkpoint_from_source(r, r.config(), Layout{}, "", r.run_state(), AdamWConfig{}, 2, remerged);
  const Checkpoint a(merged), b(remerged);
  for (const std::string& name : a.tensor_names())
    for (const char* kind : {"param", "exp_avg", "exp_avg_sq"}) {
      EXPECT_EQ(a.logical(name, kind), b.logical(name, kind)) << kind << " " << name;
      EXPECT_EQ(a.logical(name, kind), ck.logical(name, kind)) << kind << " " << name;
    }
  EXPECT_EQ(b.run_state().consumed_samples, ck.run_state().consumed_samples);
}

TEST(Convert, ExportImportRoundTrip) {
  for (NormScheme s : {NormScheme::Pre, NormScheme::LNS}) {
    const Checkpoint ck(trained(s, std::string("ex_") + norm_scheme_name(s)));
    const std::string hf = dir(std::string("hf_") + norm_scheme_name(s));
    export_hf(ck, ck.config(), hf, "", 256);
    const HfDirectory back(hf);
    EXPECT_EQ(back.config().num_layers, 5);
    EXPECT_EQ(back.config().num_kv_heads, 2);
    for (const ParamInfo& p : LlamaStage::model_params(ck.config())) {
      const auto want = ck.logical(p.name, "param"), got = back.logical(p.name, "param");
      if (s == NormScheme::LNS && p.layer >= 0 && p.kind == ParamKind::NormGain) {
        // Folded: gain * 1/sqrt(l), exact up to f32 rounding of one product.
        const double sc = 1.0 / std::sqrt(double(p.layer + 1));
        for (size_t i = 0; i < want.size(); ++i)
          EXPECT_NEAR(got[i], want[i] * sc, 1e-7 * std::abs(want[i] * sc)) << p.name;
      } else {
        EXPECT_EQ(got, want) << p.name;  // bit for bit
      }
    }
  }
}

TEST(Convert, FoldedLnsExportComputesTheSameFunction) {
  const Checkpoint ck(trained(NormScheme::LNS, "fold"));
  const std::string hf = dir("fold_hf");
  export_hf(ck, ck.config(), hf, "", 256);
  const HfDirectory back(hf);
  LlamaStage lns(ck.config(), StageSpec::whole(ck.config()), 2, 8), pre(back.config(), StageSpec::whole(back.config()), 2, 8);
  ck.load_into(lns.params(), nullptr);
  load_from_source(back, pre.params(), nullptr);
  std::vector<int32_t> ids(16);
  for (int i = 0; i < 16; ++i) ids[i] = (i * 11) % 53;
  const Tensor a = lns.forward(view(ids, {2, 8}));
  const std::vector<float> la(a.f32(), a.f32() + a.numel());
  const Tensor b = pre.forward(view(ids, {2, 8}));
  EXPECT_LE(rel_max_err(b.f32(), la.data(), b.numel()), 1e-5);
}

TEST(Convert, RemoveLayersEqualsSkippingBlocks) {
  // hybrid: lns, scale_res_pre_norm, deeppost, sandwich, lns (test_util.h small_model)
  for (NormScheme s : {NormScheme::LNS, NormScheme::Mix, NormScheme::ScaleResPre, NormScheme::Hybrid}) {
    const Checkpoint ck(trained(s, std::string("rm_") + norm_scheme_name(s)));
    const LlamaConfig old = ck.config();
    const LayerRemoval plan = plan_layer_removal(old, parse_layer_list("1,3", old.num_layers, "--layers"));
    EXPECT_EQ(plan.kept, (std::vector<int>{0, 2, 4}));
    const RemovedLayers kept(ck, plan.kept);
    const LlamaConfig& cut = plan.config;
    const std::string out = dir(std::string("rm_out_") + norm_scheme_name(s));
    write_checkpoint_from_source(kept, cut, Layout{}, "", ck.run_state(), AdamWConfig{}, 2, out);
    const Checkpoint removed(out);
    EXPECT_EQ(removed.config().layer_depths, (std::vector<int>{0, 2, 4}));

    LlamaStage full(old, StageSpec::whole(old), 2, 8), small(removed.config(), StageSpec::whole(removed.config()), 2, 8);
    ck.load_into(full.params(), nullptr);
    removed.load_into(small.params(), nullptr);
    full.set_skipped_layers({1, 3});
    std::vector<int32_t> ids(16);
    for (int i = 0; i < 16; ++i) ids[i] = (i * 7 + 3) % 53;
    const Tensor a = full.forward(view(ids, {2, 8}));
    const std::vector<float> la(a.f32(), a.f32() + a.numel());
    const Tensor b = small.forward(view(ids, {2, 8}));
    EXPECT_EQ(std::vector<float>(b.f32(), b.f32() + b.numel()), la) << norm_scheme_name(s);
    // Depth, not position: kept layer 1 sits at position 1 < post_layers = 2 but was
    // trained at depth 2, so Mix-LN keeps it Pre-LN, and LNS keeps its 1/sqrt(3).
    const NormScheme want = s == NormScheme::Mix      ? NormScheme::Pre
                            : s == NormScheme::Hybrid ? NormScheme::DeepPost
                                                      : s;
    EXPECT_EQ(block_plan(removed.config(), 1).effective, want) << norm_scheme_name(s);
    if (s == NormScheme::LNS) {
      EXPECT_FLOAT_EQ(block_plan(removed.config(), 1).attn.pre_scale, 1.0f / std::sqrt(3.0f));
    }
  }
}

// export-repo writes a model for the reference repository's LlamaForCausalLM (its
// parameter names, 0-dim branch scales, NORM_TYPE / POST_NUM in config.json); import-hf
// reads it back: the same scheme and every weight bit for bit, for each of its variants
// with a parameter or pattern of its own.
TEST(Convert, RepositoryExportImportRoundTrip) {
  struct Case {
    NormScheme scheme;
    std::string layer_schemes, norm_type;
    int post_num;
  };
  for (const Case& k : {Case{NormScheme::ScaleResPre, "", "scale_res_pre_norm", 1},
                        Case{NormScheme::MonoReverse, "", "mono_reverse", 1},
                        Case{NormScheme::ScalePostPre, "", "scale_post_pre", 2},
                        Case{NormScheme::Hybrid, "post:3,pre,*", "post_pre_post_pre", 1}}) {
    LlamaConfig c = small_model(k.scheme);
    c.num_kv_heads = c.num_heads;  // the repository's attention has no GQA
    c.layer_schemes = k.layer_schemes;
    const std::string name = norm_scheme_name(k.scheme);
    const Checkpoint ck(trained(c, "repo_" + name));
    const std::string out = dir("repo_out_" + name);
    export_repo(ck, ck.config(), out, "", 256);
    const nlohmann::json config = nlohmann::json::parse(slurp(out + "/config.json"));
    EXPECT_EQ(config.at("lns_repo_norm_type"), k.norm_type);
    EXPECT_EQ(config.at("lns_repo_post_num"), k.post_num);
    EXPECT_FALSE(config.contains("num_key_value_heads"));
    const HfDirectory back(out);  // no flag: config.json names the variant
    EXPECT_EQ(back.config().norm_scheme, k.scheme) << name;
    EXPECT_EQ(back.config().layer_schemes, k.layer_schemes) << name;
    if (k.scheme == NormScheme::ScalePostPre) {
      EXPECT_EQ(back.config().post_layers, 2);
    }
    int scalars = 0;
    for (const ParamInfo& p : LlamaStage::model_params(ck.config())) {
      EXPECT_EQ(back.logical(p.name, "param"), ck.logical(p.name, "param")) << p.name;  // bit for bit
      if (p.kind != ParamKind::BranchScale) continue;
      ++scalars;
      EXPECT_TRUE(back.logical_shape(p.name).empty()) << p.name << ": the repository's 0-dim parameter";
      EXPECT_NE(ck.logical(p.name, "param")[0], kBranchScaleInit) << p.name << " did not train";
    }
    EXPECT_EQ(scalars, k.scheme == NormScheme::ScaleResPre ? 2 * c.num_layers : 0);
    // The same directory, imported with the flags a repository checkpoint needs.
    EXPECT_NE(error_of([&] { HfDirectory d(out, "post", 1); }).find("contradicts"), std::string::npos) << name;
  }
}

TEST(Convert, RefusesWhatTheRepositoryCannotRun) {
  LlamaConfig c = small_model(NormScheme::LNS);
  c.num_kv_heads = c.num_heads;
  EXPECT_NE(error_of([&] { repo_norm_type_of(c); }).find("LNS switch is never taken"), std::string::npos);
  c.norm_scheme = NormScheme::MonoReverseCorrected;
  EXPECT_NE(error_of([&] { repo_norm_type_of(c); }).find("no --norm_scheme=mono_reverse_corrected"), std::string::npos);
  c.norm_scheme = NormScheme::Hybrid, c.layer_schemes = "pre,post,*";
  EXPECT_NE(error_of([&] { repo_norm_type_of(c); }).find("none of its hybrids"), std::string::npos);
  c = small_model(NormScheme::ScaleResPre);  // GQA
  EXPECT_NE(error_of([&] { repo_norm_type_of(c); }).find("no grouped-query attention"), std::string::npos);
  // Names whose blocks the repository leaves without a forward branch, or does not know.
  for (const char* n : {"pre_post_pre_post", "LNS"})
    EXPECT_NE(error_of([&] { config_for_repo_norm_type(c, n, 1, "--repo_norm_type"); }).find("identity"),
              std::string::npos)
        << n;
  EXPECT_NE(error_of([&] { config_for_repo_norm_type(c, "pre_lns", 1, "--repo_norm_type"); })
                .find("--repo_norm_type: NORM_TYPE 'pre_lns' is not one the repository runs"),
            std::string::npos);
  // Its names map to ours (NORM_TYPE is lower-cased there; POST_NUM caps at L).
  EXPECT_EQ(config_for_repo_norm_type(c, "Post_Pre", 9, "x").norm_scheme, NormScheme::Mix);
  EXPECT_EQ(config_for_repo_norm_type(c, "Post_Pre", 9, "x").post_layers, c.num_layers);
  EXPECT_EQ(config_for_repo_norm_type(c, "scale_pre", 1, "x").norm_scheme, NormScheme::ScaledInit);
  EXPECT_EQ(config_for_repo_norm_type(c, "pre_post", 1, "x").norm_scheme, NormScheme::Pre);  // 5 layers < 7
  c.num_layers = 9;
  EXPECT_EQ(config_for_repo_norm_type(c, "pre_sandwich", 1, "x").layer_schemes, "pre:7,sandwich");
  EXPECT_EQ(config_for_repo_norm_type(c, "pre_sandwich", 1, "x").num_kv_heads, c.num_heads);
}

TEST(Convert, ExportsExactlyThePlainPreNormSchemes) {
  // The rule reads each layer's block plan, not a list of schemes: held against every
  // scheme --norm_scheme accepts, the exportable ones are the pre-norm family.
  for (const std::string& name : norm_scheme_names()) {
    LlamaConfig c = small_model(NormScheme::Pre);
    c.norm_scheme = parse_norm_scheme(name, "--norm_scheme");
    if (c.norm_scheme == NormScheme::Hybrid) c.layer_schemes = "lns,pre,*";
    const bool plain = name == "pre" || name == "lns" || name == "scaled_init" || name == "hybrid";
    const std::string err = error_of([&] { check_hf_exportable(c); });
    EXPECT_EQ(err == "(no error)", plain) << name << ": " << err;
  }
  LlamaConfig h = small_model(NormScheme::Hybrid);
  h.layer_schemes = "pre,post,*";
  EXPECT_NE(error_of([&] { check_hf_exportable(h); }).find("--norm_scheme=hybrid layer 1 normalizes after"),
            std::string::npos);
}

TEST(Convert, RefusesWhatAPlainLlamaCannotExpress) {
  LlamaConfig c = small_model(NormScheme::Post);
  EXPECT_NE(error_of([&] { check_hf_exportable(c); }).find("--norm_scheme=post normalizes after the residual add"),
            std::string::npos);
  c.norm_scheme = NormScheme::Sandwich;
  EXPECT_NE(error_of([&] { check_hf_exportable(c); }).find("sandwich"), std::string::npos);
  c.norm_scheme = NormScheme::LNS, c.norm_type = NormType::LayerNorm;
  EXPECT_NE(error_of([&] { check_hf_exportable(c); }).find("RMSNorm only"), std::string::npos);
  const std::string hf = dir("badhf");
  fs::create_directories(hf);
  std::ofstream(hf + "/config.json") << R"({"model_type": "mistral"})";
  EXPECT_NE(error_of([&] { HfDirectory d(hf); }).find("model_type 'mistral' is not 'llama'"), std::string::npos);
  EXPECT_NE(error_of([&] { parse_layer_list("2,9", 5, "--layers"); }).find("--layers=2,9: layer '9' is not in [0, 5)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { plan_layer_removal(small_model(NormScheme::LNS), {0, 1, 2, 3, 4}); }).find("every layer"),
            std::string::npos);
}

}  // namespace
}  // namespace lns

// ---- the LNS retrofit (lns/checkpoint/retrofit.h) ------------------------------------------------------
namespace lns {
namespace {

// The logits of `cfg`'s model on fixed tokens, weights from `src`; when `lns_by_hand`,
// the model runs as Pre-LN with every block norm's gain and bias multiplied here by
// 1/sqrt(l) (f64, then rounded): the retrofit's function computed independently of the
// LNS code path.
std::vector<float> logits_from(const TensorSource& src, LlamaConfig cfg, bool lns_by_hand) {
  if (lns_by_hand) cfg.norm_scheme = NormScheme::Pre;
  LlamaStage m(cfg, StageSpec::whole(cfg), 2, 8);
  load_from_source(src, m.params(), nullptr);
  if (lns_by_hand) {
    for (int i = 0; i < m.params().size(); ++i) {
      const ParamInfo& p = m.params().info(i);
      if (p.layer < 0 || (p.kind != ParamKind::NormGain && p.kind != ParamKind::NormBias)) continue;
      float* w = m.params().param(i).f32();
      for (int64_t j = 0; j < p.shape.numel(); ++j) w[j] = static_cast<float>(w[j] / std::sqrt(p.layer + 1.0));
    }
  }
  std::vector<int32_t> ids(16);
  for (int i = 0; i < 16; ++i) ids[i] = (i * 13 + 5) % 53;
  const Tensor l = m.forward(view(ids, {2, 8}));
  return {l.f32(), l.f32() + l.numel()};
}

TEST(Retrofit, LnsRetrofitIsPreLnWithGainsScaledByDepth) {
  const std::string in = trained(NormScheme::Pre, "rf_in"), out = dir("rf_out");
  const RunResult r = run_binary(LNS_CONVERT_BIN, "retrofit --in=" + in + " --out=" + out + " --norm_scheme=lns");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: retrofit --norm_scheme=lns changes the model's function"), std::string::npos)
      << r.err;
  const Checkpoint a(in), b(out);
  EXPECT_EQ(b.config().norm_scheme, NormScheme::LNS);
  ASSERT_EQ(b.run_state().conversions.size(), 1u);
  const ConversionRecord rec = b.run_state().conversions[0];  // run_state() is a copy
  EXPECT_EQ(rec.command, "retrofit");
  EXPECT_EQ(rec.from, "pre");
  EXPECT_EQ(rec.to, "lns");
  EXPECT_EQ(rec.source, in);
  EXPECT_EQ(b.run_state().step, a.run_state().step);
  for (const std::string& name : a.tensor_names()) EXPECT_EQ(b.logical(name, "param"), a.logical(name, "param"));
  const auto got = logits_from(b, b.config(), false), want = logits_from(a, b.config(), true);
  const double err = rel_max_err(got.data(), want.data(), static_cast<int64_t>(got.size()));
  EXPECT_LE(err, 1e-5);
  // ... and it is a different function from the input (the warning is not idle).
  const auto before = logits_from(a, a.config(), false);
  EXPECT_GT(rel_max_err(got.data(), before.data(), static_cast<int64_t>(got.size())), 1e-2);

  // Fine-tuning keeps the record in every later checkpoint.
  TrainConfig t;
  t.data = "random", t.seq_len = 8, t.micro_batch = 2, t.global_batch = 4, t.steps = 3;
  t.out_dir = dir("rf_ft"), t.resume = out;
  Trainer tr(b.config(), t);
  tr.train_step();
  const Checkpoint c(tr.save_checkpoint());
  EXPECT_EQ(c.run_state().conversions, b.run_state().conversions);
}

TEST(Retrofit, ImportHfWithLnsRetrofitsAndRecordsIt) {
  const Checkpoint pre(trained(NormScheme::Pre, "rf_hf_in"));
  const std::string hf = dir("rf_hf"), out = dir("rf_hf_out");
  export_hf(pre, pre.config(), hf, "", 256);
  const RunResult r = run_binary(LNS_CONVERT_BIN, "import-hf --in=" + hf + " --out=" + out + " --norm_scheme=lns");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: import-hf --norm_scheme=lns changes"), std::string::npos) << r.err;
  const Checkpoint b(out);
  EXPECT_EQ(b.config().norm_scheme, NormScheme::LNS);
  ASSERT_EQ(b.run_state().conversions.size(), 1u);
  EXPECT_EQ(b.run_state().conversions[0].command, "import-hf");
  const auto got = logits_from(b, b.config(), false), want = logits_from(pre, b.config(), true);
  EXPECT_LE(rel_max_err(got.data(), want.data(), static_cast<int64_t>(got.size())), 1e-5);
  // Without the flag (or with pre) the import is the plain Pre-LN model, no record.
  const std::string plain = dir("rf_hf_plain");
  ASSERT_EQ(run_binary(LNS_CONVERT_BIN, "import-hf --in=" + hf + " --out=" + plain).code, 0);
  EXPECT_EQ(Checkpoint(plain).config().norm_scheme, NormScheme::Pre);
  EXPECT_TRUE(Checkpoint(plain).run_state().conversions.empty());
}

TEST(Retrofit, RefusesWhatIsNotAPreLnToLnsRetrofit) {
  const std::string lns = trained(NormScheme::LNS, "rf_bad_lns"), pre = trained(NormScheme::Pre, "rf_bad_pre");
  struct Case {
    std::string args, needle;
  };
  for (const Case& c : std::vector<Case>{
           {"retrofit --in=" + lns + " --norm_scheme=lns", "the LNS retrofit takes a Pre-LN model"},
           {"retrofit --in=" + pre + " --norm_scheme=post", "--norm_scheme=post cannot be retrofitted"},
           {"retrofit --in=" + pre, "retrofit: --norm_scheme is required"},
           {"retrofit --in=" + pre + " --norm_scheme=lnss", "--norm_scheme=lnss is not a normalization scheme"}}) {
    const std::string out = dir("rf_bad_out");
    const RunResult r = run_binary(LNS_CONVERT_BIN, c.args + " --out=" + out);
    EXPECT_EQ(r.code, 1) << c.args;
    EXPECT_NE(r.last_line().find(c.needle), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out)) << c.args;
  }
  // A manifest whose conversions record is damaged is refused by name.
  LlamaConfig cfg = small_model(NormScheme::Pre);
  RunState st;
  st.conversions.push_back({"retrofit", "pre", "lns", "x", "y"});
  nlohmann::json m = make_manifest({}, cfg, Layout{}, st, std::nullopt);
  m["conversions"][0].erase("note");
  m["manifest_crc32"] = manifest_crc(m);
  EXPECT_NE(error_of([&] { parse_manifest(m, "m.json"); }).find("conversions"), std::string::npos);
}

}  // namespace
}  // namespace lns
