// Hostile and careless checkpoints and Hugging Face directories: every field of a
// manifest, a model config and an index that could send a reader outside its tensor,
// its shard or its directory, divide by zero or size an absurd allocation is refused
// with one line naming the file and the field, before anything is read or allocated,
// and the directory is left as it was. The manifest's CRC is recomputed after each
// edit: it protects against accidents, not against anyone.
#include <cmath>
#include <filesystem>
#include <functional>

#include "lns/checkpoint/checkpoint.h"
#include "lns/core/files.h"
#include "lns/checkpoint/hf_llama.h"
#include "lns/checkpoint/safetensors.h"
#include "lns/train/trainer.h"
#include "test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace lns {
namespace {

using namespace lns::test;

struct Fixture {
  std::string root, one, tp2;  // a one-rank checkpoint and a tp=2 one (split pieces)
};

const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture x;
    x.root = fresh_test_dir("hostile");
    TrainConfig t;
    t.data = "random", t.seq_len = 8, t.micro_batch = 2, t.global_batch = 4, t.steps = 1;
    t.out_dir = x.root + "/run";
    Trainer tr(small_model(NormScheme::LNS), t);
    tr.train_step();
    x.one = tr.save_checkpoint();
    const Checkpoint ck(x.one);
    Layout l;
    l.tp = 2;
    x.tp2 = x.root + "/tp2";
    write_checkpoint_from_source(ck, ck.config(), l, "", ck.run_state(), ck.info().optimizer->adam, 1, x.tp2);
    return x;
  }();
  return f;
}

// A copy of `src` whose manifest `edit` changed (CRC recomputed).
std::string edited(const std::string& src, const std::string& name, const std::function<void(json&)>& edit) {
  const std::string d = fixture().root + "/edit_" + name;
  fs::remove_all(d);
  fs::copy(src, d, fs::copy_options::recursive);
  json m = json::parse(slurp(d + "/manifest.json"));
  edit(m);
  m["manifest_crc32"] = manifest_crc(m);
  spit(d + "/manifest.json", m.dump(1));
  return d;
}

json& piece(json& m, const std::string& tensor, const std::string& kind = "param", int which = 0) {
  for (auto& p : m["tensors"])
    if (p["tensor"] == tensor && p["kind"] == kind && which-- == 0) return p;
  ADD_FAILURE() << "no piece " << tensor;
  return m;
}

// Opening and reading every tensor of d fails with `needle` in a one-line message,
// and d is unchanged.
void expect_refused(const std::string& d, const std::string& needle) {
  const auto before = snapshot(d);
  const std::string err = error_of([&] {
    const Checkpoint ck(d);
    for (const std::string& n : ck.tensor_names())
      for (const char* kind : {"param", "exp_avg", "exp_avg_sq"}) ck.logical(n, kind);
  });
  EXPECT_NE(err.find(needle), std::string::npos) << "got: " << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  EXPECT_EQ(snapshot(d), before);
}

TEST(HostileManifest, NamesStayInsideTheCheckpoint) {
  const Fixture& f = fixture();
  // A complete, valid shard outside the checkpoint: the old reader loaded it.
  fs::copy_file(f.one + "/rank_00000.safetensors", f.root + "/outside.safetensors", fs::copy_options::overwrite_existing);
  for (const std::string bad : {"../outside.safetensors", "/etc/passwd", "sub/x.safetensors", "..", ".", ""}) {
    const std::string d = edited(f.one, "name", [&](json& m) {
      m["files"][0]["name"] = bad;
      for (auto& p : m["tensors"]) p["file"] = bad;
    });
    expect_refused(d, "manifest.json: files[0].name: '" + bad + "' is not a plain file name inside the checkpoint");
  }
  // A piece that reads a file `files` does not list (so no CRC protects it).
  fs::copy_file(f.one + "/rank_00000.safetensors", f.root + "/unlisted.safetensors", fs::copy_options::overwrite_existing);
  expect_refused(edited(f.one, "unlisted", [](json& m) { piece(m, "model.norm.weight")["file"] = "other.safetensors"; }),
                 "tensors[");
  expect_refused(edited(f.one, "unlisted2", [](json& m) { piece(m, "model.norm.weight")["file"] = "other.safetensors"; }),
                 ".file: 'other.safetensors' is not listed in files (every file a piece reads must be listed with "
                 "its size and CRC32)");
  expect_refused(edited(f.one, "nofiles", [](json& m) { m["files"] = json::array(); }), "is not listed in files");
  expect_refused(edited(f.one, "twice", [](json& m) { m["files"].push_back(m["files"][0]); }), "is listed twice");
  expect_refused(edited(f.one, "ctrl", [](json& m) { m["files"][0]["name"] = "a\nb"; }),
                 "files[0].name: 'a\\x0ab' is not a plain file name");
}

TEST(HostileManifest, PiecesStayInsideTheirTensorAndShard) {
  const Fixture& f = fixture();
  const std::string t = "model.layers.0.mlp.gate_proj.weight";  // [45, 32], rows split under tp=2
  expect_refused(edited(f.one, "eb", [&](json& m) { piece(m, t)["elem_begin"] = 5; }),
                 "the piece needs 1435 float elements");
  expect_refused(edited(f.one, "ee", [&](json& m) { piece(m, t)["elem_end"] = 45 * 32 + 1; }),
                 ".elem_end: expected an integer in [0, 1440], got 1441");
  expect_refused(edited(f.one, "eb2", [&](json& m) { piece(m, t)["elem_begin"] = -1; }),
                 ".elem_begin: expected an integer in [0, 1440], got -1");
  expect_refused(edited(f.one, "order", [&](json& m) { piece(m, t)["elem_begin"] = 100, piece(m, t)["elem_end"] = 50; }),
                 ".elem_end: expected an integer in [100, 1440], got 50");
  expect_refused(edited(f.tp2, "shard", [&](json& m) { piece(m, t)["shard_begin"] = 40; }),
                 ".shard_valid: shard [40, +23) does not fit the local [23, 32] or logical [45, 32] shape");
  expect_refused(edited(f.tp2, "valid", [&](json& m) { piece(m, t)["shard_valid"] = 24; }), "does not fit the local");
  expect_refused(edited(f.tp2, "local", [&](json& m) { piece(m, t)["local"] = {23, 33}; }),
                 "outside split dimension 0");
  // Matrices are row- or column-split even on one rank; norm gains are replicated.
  expect_refused(edited(f.one, "repl", [&](json& m) { piece(m, "model.norm.weight")["local"] = {33}; }),
                 "of a replicated tensor differs from its logical shape");
  expect_refused(edited(f.one, "split1d", [&](json& m) { piece(m, "model.norm.weight")["split_dim"] = 0; }),
                 ".split_dim: only 2-D tensors are split");
  expect_refused(edited(f.one, "splitdim", [&](json& m) { piece(m, t)["split_dim"] = 2; }),
                 ".split_dim: expected an integer in [-1, 1], got 2");
  expect_refused(edited(f.one, "huge", [&](json& m) { piece(m, t)["logical"] = {int64_t{1} << 30, int64_t{1} << 30}; }),
                 "has more than 1099511627776 elements");
  expect_refused(edited(f.one, "rank5", [&](json& m) { piece(m, t)["logical"] = {1, 1, 1, 1, 1}; }),
                 ".logical: expected 1 to 4 integers, got 5");
  expect_refused(edited(f.one, "neg", [&](json& m) { piece(m, t)["local"] = {-45, -32}; }),
                 ".local[0]: expected an integer in [0, 1099511627776], got -45");
  expect_refused(edited(f.one, "shape", [&](json& m) {
                   for (auto& p : m["tensors"])
                     if (p["tensor"] == t) p["logical"] = {32, 45}, p["local"] = {32, 45}, p["split_dim"] = -1;
                 }),
                 "tensor '" + t + "' has shape [32, 45], its model config implies [45, 32]");
  expect_refused(edited(f.one, "logical", [&](json& m) {
                   json& p = piece(m, "model.norm.weight", "exp_avg");
                   p["logical"] = p["local"] = {31}, p["elem_end"] = 31;
                 }),
                 "shape [31] of 'model.norm.weight' differs from [32] in its other pieces");
  // Coverage: an element listed twice, or missing.
  expect_refused(edited(f.tp2, "overlap", [&](json& m) { m["tensors"].push_back(piece(m, t)); }),
                 "param of '" + t + "': pieces overlap at element 0");
  expect_refused(edited(f.tp2, "missing", [&](json& m) {
                   auto& ts = m["tensors"];
                   for (size_t i = 0; i < ts.size(); ++i)
                     if (ts[i]["tensor"] == t && ts[i]["kind"] == "param") {
                       ts.erase(i);
                       break;
                     }
                 }),
                 "param of '" + t + "' has 704 of 1440 elements in its pieces");
  // The entry a piece names: present, a float, exactly its element count.
  expect_refused(edited(f.one, "key", [&](json& m) { piece(m, t)["key"] = "nope"; }),
                 ".key: 'nope' is not in rank_00000.safetensors");
  expect_refused(edited(f.one, "key2", [&](json& m) { piece(m, t)["key"] = piece(m, "model.norm.weight")["key"]; }),
                 "the piece needs 1440 float elements");
}

TEST(HostileManifest, EveryFieldIsTypedAndInRange) {
  const Fixture& f = fixture();
  const std::string t = "model.norm.weight";
  expect_refused(edited(f.one, "str", [&](json& m) { piece(m, t)["elem_end"] = "32"; }),
                 ".elem_end: expected an integer in [0, 32], got \"32\"");
  expect_refused(edited(f.one, "float", [&](json& m) { piece(m, t)["elem_end"] = 31.5; }), "got 31.5");
  expect_refused(edited(f.one, "null", [&](json& m) { piece(m, t)["split_dim"] = nullptr; }), "got null");
  expect_refused(edited(f.one, "kind", [&](json& m) { piece(m, t)["kind"] = "momentum"; }),
                 ".kind: 'momentum', expected param, exp_avg or exp_avg_sq");
  expect_refused(edited(f.one, "tensor", [&](json& m) {
                   json extra = piece(m, t);
                   extra["tensor"] = "model.extra.weight";
                   m["tensors"].push_back(extra);
                 }),
                 "has tensor 'model.extra.weight', which the model of its config does not have");
  expect_refused(edited(f.one, "step", [](json& m) { m["step"] = -3; }), "manifest.json: step: expected an integer");
  expect_refused(edited(f.one, "bytes", [](json& m) { m["files"][0]["bytes"] = "many"; }),
                 "files[0].bytes: expected an integer");
  expect_refused(edited(f.one, "crc", [](json& m) { m["files"][0]["crc32"] = int64_t{1} << 33; }),
                 "files[0].crc32: expected an integer in [0, 4294967295]");
  expect_refused(edited(f.one, "tensors", [](json& m) { m["tensors"] = json::object(); }),
                 "tensors: expected an array, got an object");
  expect_refused(edited(f.one, "nofield", [](json& m) { m.erase("layout"); }), "manifest.json: layout: missing");
  expect_refused(edited(f.one, "stages", [](json& m) { m["layout"]["stage_layers"] = {{0, 3}, {3, 5}}; }),
                 "layout.stage_layers: has 2 stages, layout.pp is 1");
  expect_refused(edited(f.one, "eps", [](json& m) { m["optimizer"]["eps"] = 0; }), "optimizer.eps: must be positive");
  expect_refused(edited(f.one, "noadam", [](json& m) { m.erase("optimizer"); }),
                 "has optimizer state exp_avg for 'model.embed_tokens.weight' but no optimizer record");
  // The model config: types, ranges, products, heads before any division.
  expect_refused(edited(f.one, "heads0", [](json& m) { m["model"]["num_heads"] = 0; }),
                 "manifest.json: model: num_heads: expected an integer in [1, 16777216], got 0");
  expect_refused(edited(f.one, "kv0", [](json& m) { m["model"]["num_kv_heads"] = 0; }), "num_kv_heads: expected");
  expect_refused(edited(f.one, "heads3", [](json& m) { m["model"]["num_heads"] = 3; }),
                 "model: --hidden_size=32 must be divisible by --num_heads=3");
  expect_refused(edited(f.one, "hstr", [](json& m) { m["model"]["hidden_size"] = "32"; }),
                 "model: hidden_size: expected an integer in [1, 16777216], got \"32\"");
  expect_refused(edited(f.one, "vocab", [](json& m) { m["model"]["vocab_size"] = 1 << 24, m["model"]["hidden_size"] = 1 << 20, m["model"]["num_heads"] = 1 << 16, m["model"]["num_kv_heads"] = 1 << 15; }),
                 "the embedding (--vocab_size x --hidden_size) has 16777216 x 1048576 elements, more than the "
                 "supported 68719476736 per tensor");
  expect_refused(edited(f.one, "ffn", [](json& m) { m["model"]["intermediate_size"] = 1 << 24; }),
                 "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [45, 32], its model config implies [16777216, 32]");
  expect_refused(edited(f.one, "layers", [](json& m) {
                   m["model"]["num_layers"] = 4096, m["layout"]["stage_layers"] = {{0, 4096}};
                 }),
                 "has no weight 'model.layers.5.input_layernorm.weight', which its model config implies");
  expect_refused(edited(f.one, "layers2", [](json& m) { m["model"]["num_layers"] = 1 << 30; }),
                 "model: num_layers: expected an integer in [1, 4096]");
  expect_refused(edited(f.one, "eps0", [](json& m) { m["model"]["norm_eps"] = -1; }), "model: norm_eps: expected a number");
  expect_refused(edited(f.one, "depths", [](json& m) { m["model"]["layer_depths"] = {0, 1, 2, 3, 99}; }),
                 "layer depth 99 outside [0, 5)");
  expect_refused(edited(f.one, "scheme", [](json& m) { m["model"]["norm_scheme"] = "\x1b[31mred"; }),
                 "norm_scheme=\\x1b[31mred is not a normalization scheme");
}

TEST(HostileManifest, NotJsonOrNotOursIsOneLine) {
  const Fixture& f = fixture();
  const std::string d = f.root + "/binary";
  fs::remove_all(d);
  fs::copy(f.one, d, fs::copy_options::recursive);
  spit(d + "/manifest.json", std::string("\x89PNG\r\n\x1a\n\x00\x01garbage", 18));
  expect_refused(d, d + "/manifest.json: not valid JSON (syntax error at byte offset 0)");
  spit(d + "/manifest.json", "[1, 2]");
  expect_refused(d, "manifest.json: expected an object, got an array");
  spit(d + "/manifest.json", R"({"format": 5})");
  expect_refused(d, "manifest.json: format: expected a string, got 5");
  spit(d + "/manifest.json", R"({"format": "lns-checkpoint-v1", "manifest_crc32": "x"})");
  expect_refused(d, "manifest.json: manifest_crc32: expected an integer");
  // A shard that is a directory or a link is not read.
  const std::string link = f.root + "/link";
  fs::remove_all(link);
  fs::copy(f.one, link, fs::copy_options::recursive);
  fs::remove(link + "/rank_00000.safetensors");
  fs::create_symlink(f.one + "/rank_00000.safetensors", link + "/rank_00000.safetensors");
  expect_refused(link, "rank_00000.safetensors: not a regular file");
}

// A Hugging Face directory: one model.safetensors, or an index over several.
std::string hf_dir(const std::string& name, const std::function<void(json& config, json& index)>& edit) {
  const Fixture& f = fixture();
  const std::string d = f.root + "/hf_" + name;
  fs::remove_all(d);
  const Checkpoint ck(f.one);
  export_hf(ck, ck.config(), d, "", 64);
  json config = json::parse(slurp(d + "/config.json"));
  json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
  const SafetensorsReader weights(d + "/model.safetensors");
  for (const auto& [n, e] : weights.entries()) index["weight_map"][n] = "model.safetensors";
  edit(config, index);
  spit(d + "/config.json", config.dump());
  if (!index.is_null()) spit(d + "/model.safetensors.index.json", index.dump());
  return d;
}

void expect_hf_refused(const std::string& d, const std::string& needle) {
  const auto before = snapshot(d);
  const std::string err = error_of([&] { HfDirectory h(d); });
  EXPECT_NE(err.find(needle), std::string::npos) << "got: " << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  EXPECT_EQ(snapshot(d), before);
}

TEST(HostileHf, ConfigAndIndexAreValidated) {
  EXPECT_NO_THROW(HfDirectory(hf_dir("ok", [](json&, json&) {})));
  expect_hf_refused(hf_dir("heads", [](json& c, json&) { c["num_attention_heads"] = 0; }),
                    "config.json: num_attention_heads: expected an integer in [1, 16777216], got 0");
  // head_dim is compared only after the heads are known to be positive (was SIGFPE).
  expect_hf_refused(hf_dir("heads2", [](json& c, json&) { c["num_attention_heads"] = 0, c["head_dim"] = 8; }),
                    "num_attention_heads: expected");
  expect_hf_refused(hf_dir("str", [](json& c, json&) { c["hidden_size"] = "32"; }),
                    "config.json: hidden_size: expected an integer in [1, 16777216], got \"32\"");
  expect_hf_refused(hf_dir("ffn", [](json& c, json&) { c["intermediate_size"] = 16000000; }),
                    "weight 'model.layers.0.mlp.gate_proj.weight' is F32 [45, 32]");
  expect_hf_refused(hf_dir("vocab", [](json& c, json&) { c["vocab_size"] = int64_t{1} << 40; }),
                    "vocab_size: expected an integer in [1, 16777216]");
  expect_hf_refused(hf_dir("layers", [](json& c, json&) { c["num_hidden_layers"] = 4000; }),
                    "missing weight 'model.layers.5.input_layernorm.weight'");
  expect_hf_refused(hf_dir("tie", [](json& c, json&) { c["tie_word_embeddings"] = "yes"; }),
                    "tie_word_embeddings: expected true or false");
  const Fixture& f = fixture();
  fs::copy_file(hf_dir("ok2", [](json&, json& i) { i = nullptr; }) + "/model.safetensors", f.root + "/secret.safetensors",
                fs::copy_options::overwrite_existing);
  for (const std::string bad : {"../secret.safetensors", "/tmp/secret.safetensors", "a/b.safetensors"})
    expect_hf_refused(hf_dir("index", [&](json&, json& i) { i["weight_map"]["model.norm.weight"] = bad; }),
                      "model.safetensors.index.json: weight_map['model.norm.weight']: '" + bad +
                          "' is not a plain file name inside");
  expect_hf_refused(hf_dir("index2", [&](json&, json& i) { i["weight_map"] = json::array(); }),
                    "weight_map: expected an object, got an array");
  expect_hf_refused(hf_dir("index3", [&](json&, json& i) { i["weight_map"]["model.norm.weight"] = 7; }),
                    "weight_map['model.norm.weight']: expected a string, got 7");
}

// The tools as a user runs them on such a checkpoint: exit 1, one line, no crash;
// nothing in the checkpoint (or the run directory of a refused resume) changes.
TEST(HostileManifest, ToolsExitWithOneLine) {
  const Fixture& f = fixture();
  const std::string t = "model.layers.0.mlp.gate_proj.weight";
  // The faults that wrote out of bounds (SIGSEGV, heap corruption) and divided by zero.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {edited(f.tp2, "cli_shard", [&](json& m) { piece(m, t)["shard_begin"] = 1000000; }), "does not fit the local"},
      {edited(f.one, "cli_eb", [&](json& m) { piece(m, t)["elem_begin"] = 1 << 30; }), ".elem_begin: expected"},
      {edited(f.one, "cli_heads", [](json& m) { m["model"]["num_heads"] = 0; }), "num_heads: expected"},
      {edited(f.one, "cli_str", [](json& m) { m["model"]["num_heads"] = "4"; }), "num_heads: expected"},
  };
  std::vector<int32_t> toks(200, 3);
  write_token_file(f.root + "/val.tok", toks, {0, 200}, 2, 53);
  const std::string model = "--vocab_size=53 --hidden_size=32 --intermediate_size=45 --num_layers=5 "
                            "--num_heads=4 --num_kv_heads=2 --post_layers=2 --init_std=0.1 --seq_len=8 "
                            "--micro_batch_size=2 --global_batch_size=4 --steps=2";
  for (const auto& [d, needle] : cases) {
    const auto before = snapshot(d);
    for (const auto& [bin, args] : std::vector<std::pair<std::string, std::string>>{
             {LNS_EVAL_BIN, "--checkpoint=" + d + " --data=" + f.root + "/val.tok"},
             {LNS_CONVERT_BIN, "merge --in=" + d + " --out=" + d + "_merged"},
             {LNS_CONVERT_BIN, "export-hf --in=" + d + " --out=" + d + "_hf"},
             {LNS_TRAIN_BIN, model + " --resume=" + d + " --out_dir=" + d + "_run"}}) {
      const RunResult r = run_binary(bin, args);
      EXPECT_EQ(r.code, 1) << bin << " " << args << "\n" << r.err;
      EXPECT_NE(r.last_line().find(needle), std::string::npos) << r.err;
      EXPECT_NE(r.last_line().find(": error: "), std::string::npos) << r.err;
    }
    EXPECT_EQ(snapshot(d), before);
    EXPECT_FALSE(fs::exists(d + "_merged"));
    EXPECT_FALSE(fs::exists(d + "_hf"));
    EXPECT_FALSE(fs::exists(d + "_run/config.flags"));  // a refused run writes nothing
  }
}

}  // namespace
}  // namespace lns
