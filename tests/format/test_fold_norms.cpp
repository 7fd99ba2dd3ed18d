// lns_convert fold-norms (docs/ln_free.md, lns/checkpoint/fold_norms.h): a model trained with
// --ln_free until every norm divides by one constant, folded, computes what the LN-free
// model computes (logits in process, lns_eval as a user runs it, a fine-tuning step),
// has no norm tensors, and every input that cannot be folded is refused with one line
// naming the norm and the layer.
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "lns/checkpoint/checkpoint.h"
#include "lns/data/data.h"
#include "lns/core/errors.h"
#include "lns/checkpoint/fold_norms.h"
#include "lns/checkpoint/hf_llama.h"
#include "lns/checkpoint/manifest.h"
#include "lns/checkpoint/retrofit.h"
#include "lns/checkpoint/safetensors.h"
#include "lns/train/trainer.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace lns {
namespace {

using namespace lns::test;

const std::string kRoot = ::testing::TempDir() + "/lns_fold_" + std::to_string(::getpid());

std::string corpus() {
  const std::string p = kRoot + "_corpus.tok";
  if (fs::exists(p)) return p;
  std::vector<int32_t> toks;
  for (int i = 0; i < 1200; ++i) toks.push_back((i * 17 + i / 7) % 53);
  write_token_file(p, toks, {0, 1200}, 2, 53);
  return p;
}

// Every norm replaced, q/k and v at their own constants (v calibrated after q/k moved the
// earlier layers), then position 0's special case dropped: the model fold-norms takes.
constexpr const char* kFullSchedule = "mlp@1,attn_qk@+1,attn_v@+1,final@+1,drop_pos0@+1";

TrainConfig train_config(const std::string& name, const std::string& schedule, int64_t steps) {
  TrainConfig t;
  t.data = corpus(), t.seq_len = 8, t.micro_batch = 2, t.global_batch = 4, t.steps = steps, t.lr = 5e-4;
  t.out_dir = kRoot + "_" + name;
  t.ln_free = schedule;
  t.ln_free_calib_tokens = 32;
  return t;
}

// A checkpoint trained `steps` steps under `schedule` (6 steps: the whole kFullSchedule).
// init_std 0.02: with small_model's 0.1, dropping position 0's constant after so few steps
// makes the first row of a sequence blow up (an lns_eval loss in the hundreds), a model
// too broken to say anything about its loss.
std::string ln_free_checkpoint(LlamaConfig c, const std::string& name, const std::string& schedule = kFullSchedule,
                               int64_t steps = 6) {
  c.init_std = 0.02f;
  TrainConfig t = train_config(name, schedule, steps);
  fs::remove_all(t.out_dir);
  Trainer tr(c, t);
  for (int64_t i = 0; i < steps; ++i) tr.train_step();
  return tr.save_checkpoint();
}

std::string fold(const std::string& in, const std::string& name) {
  const Checkpoint ck(in);
  const FoldedNorms folded(ck);
  const std::string out = kRoot + "_" + name;
  fs::remove_all(out);
  write_checkpoint_from_source(folded, folded.config(), Layout{}, "", folded.run_state(), AdamWConfig{}, 0, out);
  return out;
}

// Logits of the first micro-batch of the corpus: the LN-free model (its constants
// applied, or left live when `live`) or the folded one.
std::vector<float> logits(const Checkpoint& ck, bool live = false) {
  LlamaStage st(ck.config(), StageSpec::whole(ck.config()), 2, 8);
  ck.load_into(st.params(), nullptr);
  if (!live) apply_ln_free(ck.run_state().ln_free, st);
  std::vector<int32_t> ids(16);
  for (int i = 0; i < 16; ++i) ids[i] = (i * 17 + i / 7) % 53;
  const Tensor out = st.forward(view(ids, {2, 8}));
  return std::vector<float>(out.f32(), out.f32() + out.numel());
}

struct Case {
  NormScheme scheme;
  bool tied;
  std::string layer_schemes;  // hybrid: a pattern of pre-norm forms only
};

TEST(FoldNorms, FoldedModelComputesTheLnFreeModel) {
  for (const Case& k : {Case{NormScheme::LNS, false, ""}, Case{NormScheme::Pre, true, ""},
                        Case{NormScheme::ScaleResPre, false, ""},
                        Case{NormScheme::Hybrid, false, "lns,scale_res_pre_norm,pre,*"}}) {
    const std::string tag = std::string(norm_scheme_name(k.scheme)) + (k.tied ? "_tied" : "");
    LlamaConfig c = small_model(k.scheme);
    c.tie_embeddings = k.tied;
    if (!k.layer_schemes.empty()) c.layer_schemes = k.layer_schemes;
    const Checkpoint ck(ln_free_checkpoint(c, "lf_" + tag));
    const LnFreeState& lf = ck.run_state().ln_free;
    ASSERT_TRUE(lf.fully_constant(ln_free_slots(c))) << tag;
    // The folds must take v's own constant: the schedule gave it one.
    bool v_differs = false;
    for (int l = 0; l < c.num_layers; ++l)
      v_differs |= lf.find(l, DivisorSlot::AttnQK)->rest != lf.find(l, DivisorSlot::AttnV)->rest;
    EXPECT_TRUE(v_differs) << tag;

    const Checkpoint f(fold(ck.dir(), "folded_" + tag));
    EXPECT_TRUE(f.config().folded_norms);
    EXPECT_FALSE(f.config().tie_embeddings);
    EXPECT_TRUE(f.run_state().ln_free.empty());
    EXPECT_FALSE(f.has_optimizer_state());
    ASSERT_FALSE(f.run_state().conversions.empty());
    EXPECT_EQ(f.run_state().conversions.back().command, "fold-norms");
    for (const std::string& n : f.tensor_names()) EXPECT_EQ(n.find("norm"), std::string::npos) << n;
    EXPECT_TRUE(f.has("lm_head.weight", "param"));
    // Embedding and the linears no norm feeds are the input's, bit for bit.
    EXPECT_EQ(f.logical("model.embed_tokens.weight", "param"), ck.logical("model.embed_tokens.weight", "param"));
    EXPECT_EQ(f.logical("model.layers.2.self_attn.o_proj.weight", "param"),
              ck.logical("model.layers.2.self_attn.o_proj.weight", "param"));

    const std::vector<float> want = logits(ck), got = logits(f);
    const double err = rel_max_err(got.data(), want.data(), static_cast<int64_t>(want.size()));
    std::printf("%s: folded vs LN-free logits, max relative error %.2e\n", tag.c_str(), err);
    expect_close(got, want, 1e-5, tag + ": folded logits vs the LN-free model's");
    // The constants matter: the same weights with live norms are another function.
    const std::vector<float> live = logits(ck, true);
    EXPECT_GT(rel_max_err(live.data(), want.data(), static_cast<int64_t>(want.size())), 1e-3) << tag;
  }
}

// lns_eval as a user runs it: the same loss on the folded and the LN-free checkpoint.
TEST(FoldNorms, LnsEvalOfFoldedEqualsLnsEvalOfLnFree) {
  const std::string ck = ln_free_checkpoint(small_model(NormScheme::LNS), "eval_lf");
  const std::string folded = kRoot + "_eval_folded";
  fs::remove_all(folded);
  const RunResult r = run_binary(LNS_CONVERT_BIN, "fold-norms --in=" + ck + " --out=" + folded);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("16 constant norms folded"), std::string::npos) << r.out;
  double loss[2];
  for (int i = 0; i < 2; ++i) {
    const std::string out = kRoot + "_eval_" + std::to_string(i);
    const RunResult e = run_binary(LNS_EVAL_BIN, "--checkpoint=" + (i == 0 ? ck : folded) + " --data=" + corpus() +
                                                     " --seq_len=8 --micro_batch_size=2 --eval_tokens=512 --out=" +
                                                     out);
    ASSERT_EQ(e.code, 0) << e.err;
    loss[i] = nlohmann::json::parse(slurp(out + ".json"))["loss"].get<double>();
  }
  std::printf("lns_eval loss: LN-free %.9f, folded %.9f\n", loss[0], loss[1]);
  EXPECT_NEAR(loss[1], loss[0], 1e-5 * std::abs(loss[0])) << "folded vs LN-free lns_eval loss";
  // export-hf refuses it with the reason; export-folded writes the reference's files.
  const RunResult hf = run_binary(LNS_CONVERT_BIN, "export-hf --in=" + folded + " --out=" + kRoot + "_eval_hf");
  EXPECT_NE(hf.code, 0);
  EXPECT_NE(hf.last_line().find("a Hugging Face LLaMA always normalises"), std::string::npos) << hf.err;
  EXPECT_FALSE(fs::exists(kRoot + "_eval_hf"));
  const std::string ex = kRoot + "_eval_export";
  fs::remove_all(ex);
  const RunResult x = run_binary(LNS_CONVERT_BIN, "export-folded --in=" + folded + " --out=" + ex);
  ASSERT_EQ(x.code, 0) << x.err;
  const auto cfg = nlohmann::json::parse(slurp(ex + "/config.json"));
  EXPECT_EQ(cfg["model_type"], "lns_llama_nonorm");
  EXPECT_EQ(cfg["num_hidden_layers"], 5);
  const SafetensorsReader w(ex + "/model.safetensors");
  const Checkpoint fc(folded);
  EXPECT_EQ(w.read_f32("model.layers.3.mlp.up_proj.weight"), fc.logical("model.layers.3.mlp.up_proj.weight", "param"));
  EXPECT_EQ(w.entries().size(), fc.tensor_names().size());
  // export-folded of a model with norms is refused.
  const RunResult bad = run_binary(LNS_CONVERT_BIN, "export-folded --in=" + ck + " --out=" + kRoot + "_eval_bad");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.last_line().find("the model has norms"), std::string::npos) << bad.err;
}

// lns_train fine-tunes a folded checkpoint (--folded_norms): its first step's loss is the
// LN-free model's on the same batch; without the flag the resume is refused.
TEST(FoldNorms, FineTuningResumesTheFoldedModel) {
  LlamaConfig c = small_model(NormScheme::LNS);
  const std::string ck = ln_free_checkpoint(c, "ft_lf");
  const std::string folded = fold(ck, "ft_folded");
  TrainConfig t = train_config("ft_run_lf", "", 7);
  c.init_std = 0.02f;  // as ln_free_checkpoint trained it (the flags must match)
  fs::remove_all(t.out_dir);
  t.resume = ck;
  Trainer a(c, t);
  const double want = a.train_step().loss;
  t.out_dir = kRoot + "_ft_run_folded", t.resume = folded;
  fs::remove_all(t.out_dir);
  LlamaConfig fc = c;
  fc.folded_norms = true;
  Trainer b(fc, t);
  EXPECT_NEAR(b.train_step().loss, want, 1e-5 * want);
  t.out_dir = kRoot + "_ft_run_bad";
  fs::remove_all(t.out_dir);
  try {
    Trainer bad(c, t);
    ADD_FAILURE() << "resumed a folded checkpoint without --folded_norms";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("folded_norms is true but the flags say --folded_norms=false"),
              std::string::npos)
        << e.what();
  }
}

void expect_refused(const std::string& ckpt, const std::string& message) {
  const Checkpoint ck(ckpt);
  try {
    FoldedNorms f(ck);
    ADD_FAILURE() << ckpt << ": folded, expected '" << message << "'";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

TEST(FoldNorms, RefusesWhatCannotBeFoldedNamingTheNorm) {
  const LlamaConfig lns = small_model(NormScheme::LNS);
  // A schedule stopped half-way: the attention norm as q/k see it is live.
  expect_refused(ln_free_checkpoint(lns, "half", "mlp@1", 2),
                 "layer 0 input_layernorm as q and k see it (attn_qk) still divides by its measured RMS");
  // Everything fixed but position 0 keeps its own constant.
  expect_refused(ln_free_checkpoint(lns, "pos0", "all@1", 2),
                 "layer 0 input_layernorm as q and k see it (attn_qk) still divides position 0 by ");
  // The end-of-text case left on v.
  {
    TrainConfig e = train_config("eot", "mlp@1,attn_qk@+1,attn_v:eot@+1,final@+1,drop_pos0@+1", 6);
    e.ln_free_eot_token = 5;
    fs::remove_all(e.out_dir);
    Trainer tr(lns, e);
    for (int i = 0; i < 6; ++i) tr.train_step();
    expect_refused(tr.save_checkpoint(),
                   "layer 0 input_layernorm as v sees it (attn_v) still divides end-of-text rows (token 5)");
  }
  // LayerNorm, and a scheme with post-norms.
  LlamaConfig ln = lns;
  ln.norm_type = NormType::LayerNorm;
  expect_refused(ln_free_checkpoint(ln, "ln"), "uses --norm_type=layernorm, which is not folded");
  expect_refused(ln_free_checkpoint(small_model(NormScheme::Mix), "mix", "mlp@1", 2),
                 "layer 0 runs as --norm_scheme=post, whose post_attention_layernorm is not a pre-norm");
  // A folded model has nothing left to fold, and no norm output for the LNS retrofit to scale.
  const std::string folded = fold(ln_free_checkpoint(small_model(NormScheme::Pre), "twice"), "twice_folded");
  expect_refused(folded, "is already folded");
  try {
    plan_lns_retrofit(Checkpoint(folded).config(), "lns", "retrofit", folded);
    ADD_FAILURE() << "retrofitted a folded model";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("has its norms folded away"), std::string::npos) << e.what();
  }
}

void expect_config_refused(const nlohmann::json& j, const std::string& message) {
  try {
    LlamaConfig::from_json(j, "m.json: model");
    ADD_FAILURE() << j.dump() << ": accepted, expected '" << message << "'";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

// A manifest that claims folded norms it does not have (or cannot have) is refused.
TEST(FoldNorms, HostileFoldedManifestsAreRefused) {
  expect_config_refused({{"folded_norms", "yes"}}, "m.json: model: folded_norms");
  expect_config_refused({{"folded_norms", true}, {"norm_type", "layernorm"}},
                        "--folded_norms needs --norm_type=rmsnorm");
  expect_config_refused({{"folded_norms", true}, {"tie_embeddings", true}},
                        "--folded_norms needs --tie_embeddings=false");
  expect_config_refused({{"folded_norms", true}, {"norm_scheme", "mix"}, {"post_layers", 1}},
                        "--folded_norms: layer 0 of --norm_scheme=mix runs as post, which has norms other than "
                        "pre-norms");
  // An LN-free checkpoint relabelled as folded: its norm tensors are not the folded model's.
  const std::string ck = ln_free_checkpoint(small_model(NormScheme::LNS), "relabel");
  nlohmann::json m = nlohmann::json::parse(slurp(ck + "/manifest.json"));
  m["model"]["folded_norms"] = true;
  m.erase("manifest_crc32");
  m["manifest_crc32"] = manifest_crc(m);
  spit(ck + "/manifest.json", m.dump(1));
  try {
    Checkpoint bad(ck);
    ADD_FAILURE() << "a relabelled LN-free checkpoint opened as folded";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("layernorm.weight', which the model of its config does not have"),
              std::string::npos)
        << e.what();
  }
}

// The tool: --out inside --in and a non-empty --out are refused, the input untouched.
TEST(FoldNorms, NeverWritesIntoItsInput) {
  const std::string ck = ln_free_checkpoint(small_model(NormScheme::Pre), "tool");
  const auto before = snapshot(ck);
  RunResult r = run_binary(LNS_CONVERT_BIN, "fold-norms --in=" + ck + " --out=" + ck + "/folded");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.last_line().find("lies inside --in="), std::string::npos) << r.err;
  const std::string busy = kRoot + "_tool_busy";
  fs::create_directories(busy);
  spit(busy + "/notes.txt", "mine");
  r = run_binary(LNS_CONVERT_BIN, "fold-norms --in=" + ck + " --out=" + busy);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.last_line().find("--out=" + busy), std::string::npos) << r.err;
  EXPECT_EQ(slurp(busy + "/notes.txt"), "mine");
  EXPECT_EQ(snapshot(ck), before);
}

}  // namespace
}  // namespace lns
