// LN-free fine-tuning (docs/ln_free.md): the --ln_free grammar and its errors, the
// schedule's decisions from losses, the state's checkpoint form, and the block with
// separate q/k and v divisors and the end-of-text case (gradients against finite
// differences, a two-stage split against the whole model).
#include <cmath>
#include <cstring>

#include "lns/core/json_in.h"
#include "lns/train/ln_free_schedule.h"
#include "lns/model/stage.h"
#include "lns/train/trainer.h"
#include "test_util.h"

namespace lns {
namespace {

using namespace lns::test;

LlamaConfig tiny(NormScheme scheme = NormScheme::Pre) {
  LlamaConfig c;
  c.vocab_size = 29, c.hidden_size = 36, c.intermediate_size = 45, c.num_layers = 4;
  c.num_heads = 6, c.num_kv_heads = 3, c.norm_scheme = scheme, c.post_layers = 2;
  c.tie_embeddings = false, c.init_std = 0.2f, c.embed_init_std = 1.0f;
  return c;
}

constexpr const char* kRecipe =
    "mlp@+100,attn_qk@~0.05/200,attn_v:eot@~0.05/200,final@~0.05/200,drop_eot@~0.05/200,drop_pos0@~0.05/200";

std::string error_of(const std::string& text, const LlamaConfig& cfg, int eot = 0) {
  try {
    parse_ln_free_schedule(text, cfg, eot);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(LnFreeSchedule, ParsesTheRecipe) {
  const LlamaConfig cfg = tiny();
  const auto ev = parse_ln_free_schedule(kRecipe, cfg, 0);
  ASSERT_EQ(ev.size(), 6u);
  using A = LnFreeEvent::Action;
  using T = LnFreeEvent::Trigger;
  EXPECT_EQ(ev[0].action, A::Replace);
  EXPECT_EQ(ev[0].trigger, T::AfterSteps);
  EXPECT_EQ(ev[0].steps, 100);
  ASSERT_EQ(ev[0].norms.size(), 4u);  // the 4 layers' MLP pre-norms
  for (int l = 0; l < 4; ++l) EXPECT_EQ(ev[0].norms[l], std::make_pair(l, DivisorSlot::Mlp));
  EXPECT_EQ(ev[1].trigger, T::LossWithin);
  EXPECT_DOUBLE_EQ(ev[1].tol, 0.05);
  EXPECT_EQ(ev[1].steps, 200);
  EXPECT_EQ(ev[2].norms.front(), std::make_pair(0, DivisorSlot::AttnV));
  EXPECT_TRUE(ev[2].eot);
  EXPECT_FALSE(ev[1].eot);
  ASSERT_EQ(ev[3].norms.size(), 1u);
  EXPECT_EQ(ev[3].norms[0], std::make_pair(4, DivisorSlot::Final));
  EXPECT_EQ(ev[4].action, A::DropEot);
  EXPECT_EQ(ev[5].action, A::DropPos0);
  // layer ranges, 'attn' = q/k and v, absolute steps
  const auto r = parse_ln_free_schedule("attn[1-2]@7, mlp[3]@7,all[0]@9", cfg, -1);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].trigger, T::AtStep);
  EXPECT_EQ(r[0].steps, 7);
  EXPECT_EQ(r[0].norms, (std::vector<std::pair<int, DivisorSlot>>{
                            {1, DivisorSlot::AttnQK}, {1, DivisorSlot::AttnV}, {2, DivisorSlot::AttnQK},
                            {2, DivisorSlot::AttnV}}));
  EXPECT_EQ(r[1].norms, (std::vector<std::pair<int, DivisorSlot>>{{3, DivisorSlot::Mlp}}));
  // all[0]: layer 0's three slots and the final norm
  EXPECT_EQ(r[2].norms.size(), 4u);
  // Mix-LN: 'mlp' covers only the pre-norm layers (post_layers = 2)
  const auto m = parse_ln_free_schedule("mlp@1", tiny(NormScheme::Mix), -1);
  EXPECT_EQ(m[0].norms, (std::vector<std::pair<int, DivisorSlot>>{{2, DivisorSlot::Mlp}, {3, DivisorSlot::Mlp}}));
}

TEST(LnFreeSchedule, BadSchedulesNameTheFlagAndTheEntry) {
  const LlamaConfig cfg = tiny();
  struct Case {
    std::string text, expect;
  };
  for (const Case& c : std::vector<Case>{
           {"mlp", "'mlp': expected ACTION@TRIGGER"},
           {"mlp@", "empty trigger"},
           {"mlp@x", "step 'x' is not an integer"},
           {"mlp@-3", "step '-3' is not an integer"},
           {"mlp@+", "step count '' is not an integer"},
           {"norms@4", "unknown group 'norms'"},
           {"mlp[2-1]@4", "layers 2-1 are not a range"},
           {"mlp[9]@4", "layers 9-9 are not a range inside [0, 3]"},
           {"mlp[1@4", "layer range is written"},
           {"final[0]@4", "the final norm takes no layer range"},
           {"mlp@~0.1", "the first event cannot wait for the loss"},
           {"mlp@1,attn@~x", "loss tolerance 'x' is not a number"},
           {"mlp@1,attn@~0.1/0", "step cap after '/' must be > 0"},
           {"mlp@1,mlp[2]@4", "layer 2 mlp is already replaced"},
           {"drop_eot@3", "no earlier event has the end-of-text case"},
           {"mlp@1,,final@2", "empty entry"},
       })
    EXPECT_NE(error_of(c.text, cfg).find(c.expect), std::string::npos) << c.text << ": " << error_of(c.text, cfg);
  EXPECT_NE(error_of("attn_v:eot@3", cfg, -1).find("':eot' needs --ln_free_eot_token"), std::string::npos);
  EXPECT_NE(error_of("mlp@3", tiny(NormScheme::Post)).find("no layer has that pre-norm in scheme post"),
            std::string::npos);
  EXPECT_NE(error_of("mlp[1]@3", tiny(NormScheme::Mix)).find("layer 1 has no MLP pre-norm in scheme mix"),
            std::string::npos);
  for (const std::string& e : {error_of("mlp", cfg), error_of("attn_v:eot@3", cfg, -1)})
    EXPECT_EQ(e.rfind("--ln_free", 0), 0u) << e;
}

// The triggers, step by step: +N counts from the previous event, ~TOL waits for a full
// window of losses within TOL of the baseline (the window before the first event), or
// for its cap.
TEST(LnFreeSchedule, DueFollowsStepsAndLosses) {
  const LlamaConfig cfg = tiny();
  const LnFreeSchedule s("mlp@+3,attn@~0.1/50,final@~0.1,drop_pos0@20", cfg, -1, 2);
  LnFreeState st = s.initial_state();
  DivisorSums sums(2 * cfg.num_layers + 1, {4.0, 2.0, 9.0, 3.0});  // pos0 2, rest 3
  std::string why;
  for (double l : {5.0, 4.0, 3.0}) s.record_loss(st, l);  // the window keeps the last 2
  EXPECT_EQ(s.due(st, 2), nullptr);
  const LnFreeEvent* e = s.due(st, 3, &why);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(why, "3 steps since the previous event");
  const auto fixed = apply_event(st, *e, 3, sums);
  ASSERT_EQ(fixed.size(), 4u);
  EXPECT_EQ(fixed[0].pos0, 2.0f);
  EXPECT_EQ(fixed[0].rest, 3.0f);
  EXPECT_EQ(fixed[0].step, 3);
  EXPECT_TRUE(st.progress.has_baseline);
  EXPECT_DOUBLE_EQ(st.progress.baseline_loss, 3.5);  // mean of the window {4, 3}
  EXPECT_TRUE(st.progress.recent_losses.empty());
  // after the bump: one loss is not a full window; then 3.7 > 3.5 + 0.1; then it recovers
  s.record_loss(st, 3.55);
  EXPECT_EQ(s.due(st, 4), nullptr);
  s.record_loss(st, 3.9);
  EXPECT_EQ(s.due(st, 5), nullptr);  // mean 3.725
  s.record_loss(st, 3.6);
  EXPECT_EQ(s.due(st, 6), nullptr);  // mean of {3.9, 3.6} = 3.75 > 3.6
  s.record_loss(st, 3.5);
  e = s.due(st, 7, &why);  // mean 3.55 <= 3.6
  ASSERT_NE(e, nullptr);
  EXPECT_NE(why.find("mean loss 3.55 of the last 2 steps within 0.1 of the baseline 3.5"), std::string::npos) << why;
  EXPECT_EQ(apply_event(st, *e, 7, sums).size(), 8u);  // attn: q/k and v of 4 layers
  // the final norm: the loss never recovers and this event has no cap
  for (int i = 0; i < 30; ++i) s.record_loss(st, 9.0);
  EXPECT_EQ(s.due(st, 37), nullptr);
  // a cap fires whatever the loss: the attn event's cap of 50, seen from the state before
  LnFreeState capped = st;
  capped.progress.next_event = 1;
  EXPECT_EQ(s.due(capped, 7 + 49), nullptr);
  ASSERT_NE(s.due(capped, 7 + 50, &why), nullptr);
  EXPECT_NE(why.find("after the cap of 50 steps"), std::string::npos) << why;
  // the loss recovers: the final norm; then drop_pos0 (at step 20, long past) makes
  // position 0 divide by the rest constant
  s.record_loss(st, 3.0);
  EXPECT_EQ(s.due(st, 38), nullptr);  // {9, 3}
  s.record_loss(st, 3.0);
  ASSERT_NE(s.due(st, 38), nullptr);
  apply_event(st, *s.due(st, 38), 38, sums);
  ASSERT_NE(s.due(st, 38), nullptr);
  apply_event(st, *s.due(st, 38), 38, sums);
  EXPECT_FALSE(st.pos0_special);
  EXPECT_EQ(st.pos0_divisor(st.norms[0]), 3.0f);
  EXPECT_EQ(s.due(st, 1000), nullptr);  // done
  EXPECT_TRUE(st.fully_constant(ln_free_slots(cfg)));
  // a measured divisor of 0 (no rows) is refused with the flag's name
  LnFreeState fresh = s.initial_state();
  DivisorSums none(2 * cfg.num_layers + 1, {0.0, 0.0, 0.0, 0.0});
  EXPECT_THROW(apply_event(fresh, s.events()[0], 3, none), UserError);
}

// The checkpoint form: every field round-trips exactly (divisors are f32 stored as
// JSON doubles), and a hostile value is refused with the file and field.
TEST(LnFreeState, JsonRoundTripAndHostileValues) {
  LnFreeState st;
  st.eot_token = 7;
  st.pos0_special = false;
  st.norms = {{2, DivisorSlot::AttnV, 12.345678f, 0.1f + 1e-8f, true, 40}, {4, DivisorSlot::Final, 3.0f, 1.0f / 3, false, 90}};
  st.progress = {"mlp@1", 3, 90, true, 2.718281828459045, {3.1, 1.0 / 3.0, 2.9}};
  const nlohmann::json j = nlohmann::json::parse(st.to_json().dump());
  EXPECT_EQ(LnFreeState::from_json(JsonIn(j, "m.json", "ln_free"), 4), st);
  LnFreeState no_baseline;
  no_baseline.progress.schedule = "mlp@1";
  EXPECT_EQ(LnFreeState::from_json(JsonIn(no_baseline.to_json(), "m.json"), 4), no_baseline);
  auto refuse = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& expect) {
    nlohmann::json bad = j;
    edit(bad);
    try {
      LnFreeState::from_json(JsonIn(bad, "m.json", "ln_free"), 4);
      ADD_FAILURE() << "accepted: " << expect;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
  };
  refuse([](auto& b) { b["norms"][0]["pos0"] = 0; }, "m.json: ln_free.norms[0].pos0: must be > 0");
  refuse([](auto& b) { b["norms"][0]["rest"] = -1; }, "ln_free.norms[0].rest");
  refuse([](auto& b) { b["norms"][0]["rest"] = 1e300; }, "ln_free.norms[0].rest");
  refuse([](auto& b) { b["norms"][0]["slot"] = "attn"; }, "expected mlp, attn_qk, attn_v or final");
  refuse([](auto& b) { b["norms"][0]["layer"] = 4; }, "the final norm is layer 4");
  refuse([](auto& b) { b["norms"][1]["layer"] = 3; }, "the final norm is layer 4");
  refuse([](auto& b) { b["norms"][0]["layer"] = 5; }, "ln_free.norms[0].layer");
  refuse([](auto& b) { b["norms"][1] = b["norms"][0]; }, "listed twice");
  refuse([](auto& b) { b["eot_token"] = -1; }, "eot_token is -1");
  refuse([](auto& b) { b["schedule"]["next_event"] = -2; }, "ln_free.schedule.next_event");
  refuse([](auto& b) { b["schedule"]["recent_losses"][1] = "x"; }, "recent_losses[1]");
  refuse([](auto& b) { b["version"] = 2; }, "ln_free.version: expected 1");
  refuse([](auto& b) { b.erase("norms"); }, "ln_free.norms: missing");
}

std::vector<float> copy_of(Tensor t) { return {t.f32(), t.f32() + t.numel()}; }

// Attention's pre-norm with different divisors for q/k and for v, the end-of-text case
// on v, an MLP pre-norm and the final norm fixed: the stage's gradients match central
// finite differences of its loss (RMSNorm Pre-LN and LayerNorm LNS). The embedding's
// gradient flows through both copies of the attention norm's dx.
TEST(LnFreeStage, SeparateQkAndVDivisorsMatchFiniteDifferences) {
  for (const bool layer_norm : {false, true}) {
    LlamaConfig cfg = tiny(layer_norm ? NormScheme::LNS : NormScheme::Pre);
    if (layer_norm) cfg.norm_type = NormType::LayerNorm;
    const int64_t B = 2, T = 5, N = B * T;
    const int32_t eot = 3;
    std::vector<int32_t> ids(N), targets(N);
    for (int64_t i = 0; i < N; ++i) ids[i] = (7 * i + 3) % cfg.vocab_size;  // ids[0] = 3, ids[6] = 16
    ids[2] = eot, ids[8] = eot;
    for (int64_t i = 0; i < N; ++i) targets[i] = (5 * i + 1) % cfg.vocab_size;
    LlamaStage st(cfg, StageSpec::whole(cfg), B, T);
    st.init_weights(7);
    st.set_fixed_divisor(1, DivisorSlot::AttnQK, 2.0f, 0.9f);
    st.set_fixed_divisor(1, DivisorSlot::AttnV, 3.0f, 1.7f, eot);
    st.set_fixed_divisor(2, DivisorSlot::AttnV, 2.5f, 1.1f);  // v alone: q/k stay live
    st.set_fixed_divisor(2, DivisorSlot::Mlp, 2.0f, 1.3f);
    st.set_fixed_divisor(cfg.num_layers, DivisorSlot::Final, 4.0f, 2.5f);
    EXPECT_TRUE(st.needs_token_ids());
    EXPECT_THROW(st.set_fixed_divisor(1, DivisorSlot::Final, 1.0f, 1.0f), UserError);
    EXPECT_THROW(st.set_fixed_divisor(4, DivisorSlot::Mlp, 1.0f, 1.0f), UserError);
    EXPECT_THROW(st.set_fixed_divisor(0, DivisorSlot::AttnV, 1.0f, NAN), UserError);
    auto loss_now = [&] {
      st.forward(view(ids, {B, T}));
      return st.loss(view(targets, {N}));
    };
    st.params().zero_grads();
    loss_now();
    st.backward({}, 1.0f);
    for (const char* name : {"model.embed_tokens.weight", "model.layers.1.input_layernorm.weight",
                             "model.layers.2.input_layernorm.weight", "model.layers.1.self_attn.v_proj.weight",
                             "model.layers.1.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                             "model.norm.weight"}) {
      const int p = st.params().find(name);
      ASSERT_GE(p, 0) << name;
      float* w = st.params().param(p).f32();
      const float* g = st.params().grad(p).f32();
      const int64_t idx[] = {3 * cfg.hidden_size + 1, 5, 17};  // row 3 (the eot token) of the embedding is used
      for (int64_t i : idx) {
        const float keep = w[i], h = 1e-2f;
        w[i] = keep + h;
        const double up = loss_now();
        w[i] = keep - h;
        const double down = loss_now();
        w[i] = keep;
        const double want = (up - down) / (2.0 * h);
        EXPECT_NEAR(g[i], want, 2e-3 + 2e-2 * std::abs(want)) << name << "[" << i << "] ln=" << layer_norm;
      }
    }
  }
}

// What each divisor reaches, by causality: the end-of-text case moves the logits of the
// rows at and after the end-of-text token only; an end-of-text id absent from the batch
// is the same as none; q/k's position-0 constant reaches every row that attends to more
// than itself, v's every row.
TEST(LnFreeStage, EachDivisorReachesWhatItShould) {
  const LlamaConfig cfg = tiny(NormScheme::Pre);
  const int64_t B = 1, T = 6;
  std::vector<int32_t> ids = {4, 11, 9, 3, 12, 7};  // eot = 3 at position 3
  auto run = [&](float qk0, float v0, int32_t eot) {
    LlamaStage st(cfg, StageSpec::whole(cfg), B, T);
    st.init_weights(5);
    st.set_fixed_divisor(0, DivisorSlot::AttnQK, qk0, 1.0f);
    st.set_fixed_divisor(0, DivisorSlot::AttnV, v0, 1.2f, eot);
    return copy_of(st.forward(view(ids, {B, T})));
  };
  const int64_t V = cfg.vocab_size;
  auto rows_differ = [&](const std::vector<float>& a, const std::vector<float>& b) {
    std::vector<bool> d(T, false);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t v = 0; v < V; ++v) d[t] = d[t] || a[t * V + v] != b[t * V + v];
    return d;
  };
  const auto base = run(2.0f, 3.0f, 3);
  EXPECT_EQ(run(2.0f, 3.0f, 28), run(2.0f, 3.0f, -1)) << "an absent end-of-text id changes nothing";
  // the eot row (position 3) divides v by the pos0 constant: with eot off, rows 0-2 are
  // untouched (causal attention), rows 3-5 move
  EXPECT_EQ(rows_differ(base, run(2.0f, 3.0f, -1)), (std::vector<bool>{false, false, false, true, true, true}));
  // q/k's position-0 constant moves every row but row 0, whose only key is itself (its
  // attention weight is 1 whatever q and k are); v's moves every row
  EXPECT_EQ(rows_differ(base, run(2.5f, 3.0f, 3)), (std::vector<bool>{false, true, true, true, true, true}));
  EXPECT_EQ(rows_differ(base, run(2.0f, 3.5f, 3)), (std::vector<bool>{true, true, true, true, true, true}));
}

// A pipeline split with the end-of-text case on the second stage: that stage gets the
// token ids from set_token_ids() and computes exactly what the whole model does.
TEST(LnFreeStage, EndOfTextOnALaterStageEqualsTheWholeModel) {
  const LlamaConfig cfg = tiny(NormScheme::LNS);
  const int64_t B = 2, T = 5, N = B * T;
  std::vector<int32_t> ids(N), targets(N);
  for (int64_t i = 0; i < N; ++i) ids[i] = (7 * i + 3) % cfg.vocab_size;
  ids[3] = 8;
  for (int64_t i = 0; i < N; ++i) targets[i] = (5 * i + 1) % cfg.vocab_size;
  auto fix = [&](LlamaStage& st) {
    for (int l = st.spec().first_layer; l < st.spec().last_layer; ++l)
      st.set_fixed_divisor(l, DivisorSlot::AttnV, 2.0f + l, 1.0f, 8);
    if (st.spec().has_head) st.set_fixed_divisor(cfg.num_layers, DivisorSlot::Final, 3.0f, 1.5f, 8);
  };
  LlamaStage whole(cfg, StageSpec::whole(cfg), B, T);
  whole.init_weights(42);
  fix(whole);
  whole.params().zero_grads();
  const auto logits_whole = copy_of(whole.forward(view(ids, {B, T})));
  whole.loss(view(targets, {N}));
  whole.backward({}, 0.1f);
  LlamaStage first(cfg, {0, 2, true, false}, B, T), last(cfg, {2, cfg.num_layers, false, true}, B, T);
  for (LlamaStage* s : {&first, &last}) {
    s->init_weights(42);
    fix(*s);
    s->params().zero_grads();
  }
  ASSERT_TRUE(last.needs_token_ids());
  last.set_token_ids(view(ids, {B, T}));
  const auto logits_split = copy_of(last.forward(first.forward(view(ids, {B, T}))));
  EXPECT_EQ(logits_split, logits_whole);
  last.loss(view(targets, {N}));
  first.backward(last.backward({}, 0.1f), 0.1f);
  for (const char* name : {"model.layers.3.input_layernorm.weight", "model.layers.0.self_attn.v_proj.weight"}) {
    const LlamaStage& s = std::string(name).find("layers.3") != std::string::npos ? last : first;
    EXPECT_EQ(copy_of(s.params().grad(s.params().find(name))),
              copy_of(whole.params().grad(whole.params().find(name))))
        << name;
  }
  // without the ids the later stage would read stale ones: it must be given them
  LlamaStage again(cfg, {2, cfg.num_layers, false, true}, B, T);
  again.init_weights(42);
  fix(again);
  std::vector<int32_t> other(N, 1);
  again.set_token_ids(view(other, {B, T}));
  EXPECT_NE(copy_of(again.forward(first.forward(view(ids, {B, T})))), logits_whole);
}

// lns_convert remove-layers: the kept layers' fixed norms under their new numbers, the
// final norm at the new depth, a removed layer's norms gone, the schedule dropped.
TEST(LnFreeState, KeptLayersAreRenumbered) {
  LnFreeState st;
  st.eot_token = 5;
  st.norms = {{0, DivisorSlot::Mlp, 2, 1, false, 3}, {1, DivisorSlot::AttnV, 3, 1.5f, true, 4},
              {2, DivisorSlot::AttnQK, 4, 2, false, 5}, {4, DivisorSlot::Final, 6, 3, false, 6}};
  st.progress.schedule = "all@3";
  st.progress.next_event = 1;
  const LnFreeState out = ln_free_for_kept_layers(st, {0, 2, 3}, 4);
  ASSERT_EQ(out.norms.size(), 3u);
  EXPECT_EQ(out.norms[0], st.norms[0]);
  EXPECT_EQ(out.norms[1].layer, 1);
  EXPECT_EQ(out.norms[1].slot, DivisorSlot::AttnQK);
  EXPECT_EQ(out.norms[1].pos0, 4.0f);
  EXPECT_EQ(out.norms[2].layer, 3);
  EXPECT_EQ(out.norms[2].slot, DivisorSlot::Final);
  EXPECT_TRUE(out.progress.schedule.empty());
  EXPECT_EQ(out.eot_token, 5);
}

// Through the trainer, for every scheme with pre-norms (RMSNorm and LayerNorm): an 'all'
// event calibrates every pre-norm and the final norm on the first calibration sequence
// and fixes them; with one row per position group (one sequence of 2 tokens) the
// constants are those rows' own divisors, so the model's logits on that sequence are
// unchanged (f32 rounding) although every norm of the model now divides by a constant.
TEST(LnFreeTrainer, CalibrationFixesEveryPreNormOfEveryScheme) {
  const std::string path = ::testing::TempDir() + "/lns_lnfree_calib.tok";
  std::vector<int32_t> toks;
  for (int i = 0; i < 400; ++i) toks.push_back((i * 11 + 5) % 29);
  write_token_file(path, toks, {0, 400}, 2, 29);
  struct Case {
    NormScheme scheme;
    NormType type;
    const char* layer_schemes;
  };
  for (const Case c : {Case{NormScheme::Pre, NormType::RMSNorm, ""}, Case{NormScheme::LNS, NormType::LayerNorm, ""},
                       Case{NormScheme::ScaledInit, NormType::RMSNorm, ""},
                       Case{NormScheme::Sandwich, NormType::LayerNorm, ""}, Case{NormScheme::Mix, NormType::RMSNorm, ""},
                       Case{NormScheme::ScaleResPre, NormType::RMSNorm, ""},
                       Case{NormScheme::Hybrid, NormType::LayerNorm, "deeppost,scale_res_pre_norm,pre,*"}}) {
    LlamaConfig cfg = tiny(c.scheme);
    cfg.norm_type = c.type;
    cfg.layer_schemes = c.layer_schemes;
    TrainConfig t;
    t.data = path;
    t.seq_len = 2, t.micro_batch = 1, t.global_batch = 1, t.steps = 3;
    t.ln_free = "all@0";
    t.ln_free_calib_tokens = 2;
    Trainer tr(cfg, t);
    const auto corpus = TokenCorpus::open(path);
    BatchSampler first(*corpus, SampleMode::Packed, 2, 0, false, cfg.vocab_size);
    std::vector<int32_t> ids(2), tg(2);
    first.fill(0, ids.data(), tg.data());
    const auto live = copy_of(tr.model().forward(view(ids, {1, 2})));
    tr.run_ln_free_events();
    const std::string name = norm_scheme_name(c.scheme);
    ASSERT_EQ(tr.ln_free().norms.size(), ln_free_slots(cfg).size()) << name;
    EXPECT_GT(tr.ln_free().norms.size(), size_t(3)) << name;  // more than the final norm
    const auto fixed = copy_of(tr.model().forward(view(ids, {1, 2})));
    expect_close(fixed, std::vector<double>(live.begin(), live.end()), 1e-5, name);
    const FixedNorm& fin = tr.ln_free().norms.back();
    EXPECT_EQ(fin.slot, DivisorSlot::Final);
    tr.model().set_fixed_divisor(cfg.num_layers, DivisorSlot::Final, fin.pos0 * 1.02f, fin.rest);
    const auto moved = copy_of(tr.model().forward(view(ids, {1, 2})));
    double diff = 0;
    for (size_t i = 0; i < moved.size(); ++i) diff = std::max(diff, double(std::abs(moved[i] - live[i])));
    EXPECT_GT(diff, 1e-4) << name << ": a 2% different constant must show";
  }
}

}  // namespace
}  // namespace lns
