// The reference repository's other variants (docs/model.md): the per-layer pattern of
// --layer_schemes, deeppost and scale_post_pre. Their numbers against PyTorch are in
// test_model_golden.cpp (rmsnorm/layernorm x deeppost, scale_post_pre, hybrid); here:
// the pattern's meaning for the four hybrids of the repository, spelled out by hand;
// every bad pattern refused with a message naming the flag; a hybrid equal to the
// scheme it spells (post:2,pre = Mix-LN with 2 post layers, bit for bit); and the
// init rule of scale_post_pre against Mix-LN's.
#include "lns/checkpoint/hf_llama.h"
#include "lns/model/layer_schemes.h"
#include "lns/model/stage.h"
#include "test_util.h"

namespace lns {
namespace {

using namespace lns::test;
constexpr NormScheme P = NormScheme::Pre, O = NormScheme::Post, S = NormScheme::Sandwich;

TEST(LayerSchemes, TheRepositorysHybridsAtTwelveLayers) {
  using V = std::vector<NormScheme>;
  // first 7 layers pre, then post / sandwich
  EXPECT_EQ(resolve_layer_schemes("pre:7,post", 12), (V{P, P, P, P, P, P, P, O, O, O, O, O}));
  EXPECT_EQ(resolve_layer_schemes("pre:7,sandwich", 12), (V{P, P, P, P, P, P, P, S, S, S, S, S}));
  // every 4th layer post among pre (0-based layers 3, 7, 11), and the reverse
  EXPECT_EQ(resolve_layer_schemes("pre:3,post,*", 12), (V{P, P, P, O, P, P, P, O, P, P, P, O}));
  EXPECT_EQ(resolve_layer_schemes("post:3,pre,*", 12), (V{O, O, O, P, O, O, O, P, O, O, O, P}));
  // a repetition cut short; explicit counts that add up
  EXPECT_EQ(resolve_layer_schemes("pre:2,post,*", 5), (V{P, P, O, P, P}));
  EXPECT_EQ(resolve_layer_schemes("post:1,deeppost:2,lns:1", 4),
            (V{O, NormScheme::DeepPost, NormScheme::DeepPost, NormScheme::LNS}));
}

TEST(LayerSchemes, BadPatternsNameTheFlag) {
  auto err = [](const std::string& p, int L = 4) { return error_of([&] { resolve_layer_schemes(p, L); }); };
  EXPECT_NE(err("").find("--layer_schemes is empty"), std::string::npos);
  EXPECT_NE(err("pre:2,poost").find("--layer_schemes=pre:2,poost: 'poost' is not a block form"), std::string::npos);
  EXPECT_NE(err("mix:2,pre").find("'mix' is not a block form"), std::string::npos);
  EXPECT_NE(err("pre:0,post").find("count '0' of item 1"), std::string::npos);
  EXPECT_NE(err("pre:x,post").find("count 'x'"), std::string::npos);
  EXPECT_NE(err("pre:99999999999999999999,post").find("must be an integer"), std::string::npos);
  EXPECT_NE(err("pre:2,post:1").find("describes 3 layers but the model has 4"), std::string::npos);
  EXPECT_NE(err("pre:4,post").find("needs at least one"), std::string::npos);
  EXPECT_NE(err("*").find("no FORM before '*'"), std::string::npos);
  // The config refuses a pattern without hybrid, and hybrid without a pattern.
  LlamaConfig c = small_model(NormScheme::Pre);
  c.layer_schemes = "pre:2,post";
  EXPECT_NE(error_of([&] { c.validate(); }).find("needs --norm_scheme=hybrid"), std::string::npos);
  c.norm_scheme = NormScheme::Hybrid, c.layer_schemes = "";
  EXPECT_NE(error_of([&] { c.validate(); }).find("--layer_schemes is empty"), std::string::npos);
  c.layer_schemes = "pre:2,post:2";  // 4 of 5 layers
  EXPECT_NE(error_of([&] { c.validate(); }).find("but the model has 5"), std::string::npos);
}

TEST(LayerSchemes, LnsTrainRefusesABadPatternInOneLine) {
  const std::string model = "--vocab_size=53 --hidden_size=32 --intermediate_size=45 --num_layers=5 "
                            "--num_heads=4 --num_kv_heads=2 --seq_len=8 --micro_batch_size=2 "
                            "--global_batch_size=2 --steps=1";
  const RunResult bad = run_binary(LNS_TRAIN_BIN, model + " --norm_scheme=hybrid --layer_schemes=pre:3,post:3");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.last_line().find("--layer_schemes=pre:3,post:3 describes 6 layers but the model has 5"),
            std::string::npos)
      << bad.err;
  const RunResult stray = run_binary(LNS_TRAIN_BIN, model + " --norm_scheme=pre --layer_schemes=pre:3,post");
  EXPECT_EQ(stray.code, 1);
  EXPECT_NE(stray.last_line().find("needs --norm_scheme=hybrid"), std::string::npos) << stray.err;
  const RunResult ok = run_binary(LNS_TRAIN_BIN, model + " --norm_scheme=hybrid --layer_schemes=pre:3,post,*");
  EXPECT_EQ(ok.code, 0) << ok.err;
}

std::vector<float> logits_of(const LlamaConfig& cfg, uint64_t seed, std::vector<std::string>* names) {
  const int64_t B = 2, T = 5;
  LlamaStage m(cfg, StageSpec::whole(cfg), B, T);
  m.init_weights(seed);
  for (const ParamInfo& p : m.params().infos()) names->push_back(p.name);
  std::vector<int32_t> ids(B * T);
  for (int64_t i = 0; i < B * T; ++i) ids[i] = (11 * i + 2) % cfg.vocab_size;
  const Tensor l = m.forward(view(ids, {B, T}));
  return {l.f32(), l.f32() + l.numel()};
}

TEST(LayerSchemes, HybridSpellingMixLnIsMixLn) {
  LlamaConfig mix = small_model(NormScheme::Mix);  // post_layers = 2 of 5
  LlamaConfig hyb = small_model(NormScheme::Hybrid);
  hyb.layer_schemes = "post:2,pre";
  std::vector<std::string> n1, n2;
  EXPECT_EQ(logits_of(hyb, 7, &n1), logits_of(mix, 7, &n2));
  EXPECT_EQ(n1, n2);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(block_plan(hyb, i).effective, i < 2 ? O : P) << i;
}

TEST(LayerSchemes, LayersKeepTheirFormByTrainedDepth) {
  // Layers 1 and 3 of "pre,post,*" (pre, post, pre, post, pre) removed: the kept
  // layers 0, 2, 4 are all pre, though positions 1 and 3 of a 5-layer pattern are post.
  LlamaConfig c = small_model(NormScheme::Hybrid);
  c.layer_schemes = "pre,post,*";
  c.num_layers = 3, c.trained_num_layers = 5, c.layer_depths = {0, 2, 4};
  c.validate();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(block_plan(c, i).effective, P) << i;
}

TEST(DeepPost, PostLnWithResidualTimesTwoSqrtTwo) {
  const BlockPlan p = block_plan(small_model(NormScheme::DeepPost), 3);
  const BlockPlan post = block_plan(small_model(NormScheme::Post), 3);
  EXPECT_EQ(p.norms(), post.norms());
  EXPECT_FLOAT_EQ(p.attn.residual_alpha, 2.0f * std::sqrt(2.0f));
  EXPECT_FLOAT_EQ(p.mlp.residual_alpha, 2.0f * std::sqrt(2.0f));
  EXPECT_FALSE(p.attn.pre_norm.has_value());
}

TEST(ScalePostPre, MixLnForwardWithScaledInitInItsPreLnLayers) {
  // Same blocks as Mix-LN; o_proj and down_proj of the Pre-LN layers (index >=
  // post_layers = 2) drawn from the same streams but scaled by 1/sqrt(2L), as the
  // repository flags them (modeling_llama.py lines 273-279); every other tensor identical.
  const LlamaConfig spp = small_model(NormScheme::ScalePostPre), mix = small_model(NormScheme::Mix);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(block_plan(spp, i).effective, block_plan(mix, i).effective);
  LlamaStage a(spp, StageSpec::whole(spp), 1, 2), b(mix, StageSpec::whole(mix), 1, 2);
  a.init_weights(3), b.init_weights(3);
  const double k = 1.0 / std::sqrt(2.0 * 5);
  int scaled = 0;
  for (int i = 0; i < a.params().size(); ++i) {
    const ParamInfo& info = a.params().info(i);
    const Tensor x = a.params().param(i), y = b.params().param(b.params().find(info.name));
    const bool out_proj =
        info.name.find("o_proj") != std::string::npos || info.name.find("down_proj") != std::string::npos;
    const bool s = out_proj && info.layer >= spp.post_layers;
    scaled += s;
    for (int64_t j = 0; j < x.numel(); ++j)
      ASSERT_NEAR(x.f32()[j], s ? y.f32()[j] * k : y.f32()[j], 1e-7 * std::abs(y.f32()[j])) << info.name;
  }
  EXPECT_EQ(scaled, 2 * (5 - 2));
}

// mono / mono_reverse: every 4th layer routed; the routed plan is a Pre-LN path 0 and a
// Post-LN path 1 sharing post_attention_layernorm.
TEST(Mono, EveryFourthLayerRoutedBetweenPreAndPost) {
  LlamaConfig c = small_model(NormScheme::Mono);
  c.num_layers = 8;
  for (int i = 0; i < 8; ++i) {
    const BlockPlan p = block_plan(c, i);
    EXPECT_EQ(p.effective, i % 4 == 3 ? NormScheme::Routed : P) << i;
    EXPECT_EQ(p.route.has_value(), i % 4 == 3) << i;
  }
  const BlockPlan r = block_plan(c, 3);
  EXPECT_EQ(r.attn.pre_norm, NormSlot::InputLayernorm);
  EXPECT_EQ(r.mlp.pre_norm, NormSlot::PostAttentionLayernorm);
  EXPECT_EQ(r.route->attn.add_norm, NormSlot::PostAttentionLayernorm);
  EXPECT_EQ(r.route->mlp.add_norm, NormSlot::PostFeedforwardLayernorm);
  EXPECT_FALSE(r.route->attn.pre_norm.has_value());
  EXPECT_EQ(r.norms(), (std::vector<NormSlot>{NormSlot::InputLayernorm, NormSlot::PostAttentionLayernorm,
                                              NormSlot::PostFeedforwardLayernorm}));
  c.norm_scheme = NormScheme::MonoReverseCorrected;
  for (int i = 0; i < 8; ++i) EXPECT_EQ(block_plan(c, i).effective, i % 4 == 3 ? NormScheme::Routed : O) << i;
  // The repository's mono_reverse: the same routed layers; its others run Post-LN with
  // post_attention_layernorm applied again to the MLP's input (modeling_llama.py lines
  // 716-723): h = N_pa(x + Attn(x)), y = N_pf(h + MLP(N_pa(h))).
  c.norm_scheme = NormScheme::MonoReverse;
  for (int i = 0; i < 8; ++i) {
    const BlockPlan p = block_plan(c, i);
    EXPECT_EQ(p.effective, i % 4 == 3 ? NormScheme::Routed : NormScheme::MonoReverse) << i;
    if (i % 4 == 3) continue;
    EXPECT_FALSE(p.attn.pre_norm.has_value()) << i;
    EXPECT_EQ(p.attn.add_norm, NormSlot::PostAttentionLayernorm) << i;
    EXPECT_EQ(p.mlp.pre_norm, NormSlot::PostAttentionLayernorm) << i;
    EXPECT_EQ(p.mlp.add_norm, NormSlot::PostFeedforwardLayernorm) << i;
    EXPECT_EQ(p.norms(), (std::vector<NormSlot>{NormSlot::PostAttentionLayernorm, NormSlot::PostFeedforwardLayernorm}));
  }
  // mono is the pattern pre:3,routed,*: the same parameters and logits, bit for bit.
  LlamaConfig mono = small_model(NormScheme::Mono), hyb = small_model(NormScheme::Hybrid);
  hyb.layer_schemes = "pre:3,routed,*";
  std::vector<std::string> n1, n2;
  EXPECT_EQ(logits_of(mono, 5, &n1), logits_of(hyb, 5, &n2));
  EXPECT_EQ(n1, n2);
  EXPECT_NE(std::find(n1.begin(), n1.end(), "model.layers.3.router.weight"), n1.end());
}

// A hard gate picks one path exactly: with noise that makes every sequence take path 0,
// mono's logits are Pre-LN's bit for bit (the shared weights are drawn by name, the
// same), and with path 1 everywhere mono_reverse_corrected's are Post-LN's.
TEST(Mono, AHardGateRunsExactlyOnePath) {
  for (bool reverse : {false, true}) {
    const LlamaConfig routed = small_model(reverse ? NormScheme::MonoReverseCorrected : NormScheme::Mono);
    const LlamaConfig plain = small_model(reverse ? O : P);
    const int64_t B = 2, T = 5;
    std::vector<int32_t> ids(B * T);
    for (int64_t i = 0; i < B * T; ++i) ids[i] = (11 * i + 2) % routed.vocab_size;
    LlamaStage m(routed, StageSpec::whole(routed), B, T), ref(plain, StageSpec::whole(plain), B, T);
    m.init_weights(5), ref.init_weights(5);
    const float big = 1e4f;  // overwhelms any router logit
    m.set_gate_noise(3, reverse ? std::vector<float>{-big, big, -big, big} : std::vector<float>{big, -big, big, -big});
    const Tensor a = m.forward(view(ids, {B, T}));
    const std::vector<float> got(a.f32(), a.f32() + a.numel());
    const Tensor b = ref.forward(view(ids, {B, T}));
    EXPECT_EQ(got, std::vector<float>(b.f32(), b.f32() + b.numel())) << "reverse=" << reverse;
  }
}

// Noise lasts one forward: the next one (evaluation) is the router's argmax, and it
// repeats; the training noise of a sequence depends on its index only.
TEST(Mono, NoiseLastsOneForwardAndIsKeyedBySample) {
  const LlamaConfig c = small_model(NormScheme::Mono);
  const int64_t B = 2, T = 5;
  std::vector<int32_t> ids(B * T);
  for (int64_t i = 0; i < B * T; ++i) ids[i] = (7 * i + 1) % c.vocab_size;
  LlamaStage m(c, StageSpec::whole(c), B, T);
  m.init_weights(5);
  auto run = [&] {
    const Tensor l = m.forward(view(ids, {B, T}));
    return std::vector<float>(l.f32(), l.f32() + l.numel());
  };
  const std::vector<float> eval = run();
  m.set_gate_noise(3, std::vector<float>{0, 0, 0, 0});
  EXPECT_EQ(run(), eval) << "zero noise is evaluation";
  m.set_gate_noise(3, std::vector<float>{-1e4f, 1e4f, 1e4f, -1e4f});
  const std::vector<float> forced = run();
  m.set_gate_noise(3, std::vector<float>{1e4f, -1e4f, -1e4f, 1e4f});
  EXPECT_NE(run(), forced) << "the other paths give other logits";
  EXPECT_EQ(run(), eval) << "noise lasts one forward";
  EXPECT_EQ(gate_noise(1, 3, 10, 1), gate_noise(1, 3, 10, 1));
  EXPECT_NE(gate_noise(1, 3, 10, 1), gate_noise(1, 3, 11, 1));
  EXPECT_NE(gate_noise(1, 3, 10, 1), gate_noise(1, 7, 10, 1));
  EXPECT_NE(gate_noise(1, 3, 10, 1), gate_noise(2, 3, 10, 1));
  // Standard Gumbel: mean = Euler's gamma 0.5772, variance pi^2/6 = 1.6449.
  double s = 0, s2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double g = gate_noise(9, 3, i / 2, i % 2);
    ASSERT_TRUE(std::isfinite(g));
    s += g, s2 += g * g;
  }
  const double mean = s / n, var = s2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.5772, 0.01);
  EXPECT_NEAR(var, 1.6449, 0.03);
}

TEST(Mono, LnsTrainRunsBothAndExportHfRefusesThemInOneLine) {
  const std::string model = "--vocab_size=53 --hidden_size=32 --intermediate_size=45 --num_layers=5 "
                            "--num_heads=4 --num_kv_heads=2 --seq_len=8 --micro_batch_size=2 "
                            "--global_batch_size=4 --steps=2";
  for (const char* s : {"mono", "mono_reverse", "mono_reverse_corrected"}) {
    const RunResult r = run_binary(LNS_TRAIN_BIN, model + " --norm_scheme=" + s);
    EXPECT_EQ(r.code, 0) << s << ": " << r.err;
  }
  for (NormScheme s :
       {NormScheme::Mono, NormScheme::MonoReverse, NormScheme::MonoReverseCorrected, NormScheme::Routed}) {
    const std::string e = error_of([&] { check_hf_exportable(small_model(s)); });
    EXPECT_NE(e.find("routes blocks between a pre- and a post-norm path"), std::string::npos) << e;
  }
  LlamaConfig hyb = small_model(NormScheme::Hybrid);
  hyb.layer_schemes = "pre:3,routed,*";
  EXPECT_NE(error_of([&] { check_hf_exportable(hyb); }).find("layer 3 is routed"), std::string::npos);
}

// scale_res_pre_norm as the repository computes it (modeling_llama.py lines 332-336,
// 456-473): x + Attn(N(x)) * a_attn, then + MLP(N(x)) * a_mlp, each a learned scalar
// starting at 0.001, named raw_scaling_factor_attn / _mlp on the layer.
TEST(ScaleResPreNorm, ScalesTheBranchWithTwoScalarsPerLayerFromOneThousandth) {
  const LlamaConfig c = small_model(NormScheme::ScaleResPre), pre = small_model(NormScheme::Pre);
  const int64_t B = 2, T = 5;
  std::vector<int32_t> ids(B * T);
  for (int64_t i = 0; i < B * T; ++i) ids[i] = (5 * i + 3) % c.vocab_size;
  LlamaStage m(c, StageSpec::whole(c), B, T), ref(pre, StageSpec::whole(pre), B, T);
  m.init_weights(9), ref.init_weights(9);
  int scales = 0;
  for (int i = 0; i < m.params().size(); ++i) {
    const ParamInfo& p = m.params().info(i);
    if (p.kind != ParamKind::BranchScale) {
      ASSERT_GE(ref.params().find(p.name), 0) << p.name << " is not a Pre-LN parameter";
      continue;
    }
    ++scales;
    EXPECT_EQ(p.shape, Shape{1});
    EXPECT_EQ(p.file_shape(), Shape{}) << "the repository's 0-dim parameter";
    EXPECT_TRUE(p.replicated());
    EXPECT_FALSE(p.decays()) << p.name;
    EXPECT_EQ(m.params().param(i).f32()[0], 0.001f);
    EXPECT_TRUE(p.name == absl::StrCat("model.layers.", p.layer, ".raw_scaling_factor_attn") ||
                p.name == absl::StrCat("model.layers.", p.layer, ".raw_scaling_factor_mlp"))
        << p.name;
  }
  EXPECT_EQ(scales, 2 * c.num_layers);
  EXPECT_EQ(m.params().size(), ref.params().size() + 2 * c.num_layers);
  auto logits = [&](LlamaStage& s) {
    const Tensor l = s.forward(view(ids, {B, T}));
    return std::vector<float>(l.f32(), l.f32() + l.numel());
  };
  // At init every block is nearly the identity: the logits are far from Pre-LN's...
  const std::vector<float> at_init = logits(m), want = logits(ref);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) diff = std::max(diff, double(std::abs(at_init[i] - want[i]))),
                                           scale = std::max(scale, double(std::abs(want[i])));
  EXPECT_GT(diff, 0.05 * scale);
  // ...and with every scale 1 the block is Pre-LN bit for bit (1 * F + x rounds as x + F).
  for (int i = 0; i < m.params().size(); ++i)
    if (m.params().info(i).kind == ParamKind::BranchScale) m.params().param(i).f32()[0] = 1.0f;
  EXPECT_EQ(logits(m), want);
}

}  // namespace
}  // namespace lns
