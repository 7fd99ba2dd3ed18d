#include "lns/checkpoint/manifest.h"

#include <map>
#include <set>

#include "lns/checkpoint/checkpoint.h"
#include "lns/core/errors.h"
#include "lns/core/files.h"
#include "lns/core/json_in.h"

namespace lns {
namespace {

constexpr int64_t kMaxCount = int64_t{1} << 62;  // steps, tokens: far beyond any run
constexpr int kMaxRanks = 1 << 20;

std::string shape_str(const std::vector<int64_t>& s) { return Shape(s).str(); }

OptimizerRecord parse_optimizer(const JsonIn& j) {
  if (j["type"].string() != "adamw") j["type"].error("expected \"adamw\"");
  OptimizerRecord o;
  auto beta = [&](const char* k) {
    const double b = j[k].number(0, 1);
    if (b >= 1) j[k].error("must be below 1");
    return static_cast<float>(b);
  };
  o.adam.beta1 = beta("beta1");
  o.adam.beta2 = beta("beta2");
  o.adam.eps = static_cast<float>(j["eps"].number(0, 1));
  if (!(o.adam.eps > 0)) j["eps"].error("must be positive");
  o.adam.weight_decay = static_cast<float>(j["weight_decay"].number(0, 1e3));
  o.steps_taken = j["steps_taken"].integer(0, kMaxCount);
  return o;
}

TrainingRecord parse_training(const JsonIn& j) {
  TrainingRecord t;
  t.seq_len = j["seq_len"].integer(1, INT32_MAX);
  t.data_mode = j["data_mode"].string();
  if (t.data_mode != "packed" && t.data_mode != "document") j["data_mode"].error("expected packed or document");
  t.micro_batch = j["micro_batch_size"].integer(1, INT32_MAX);
  t.global_batch = j["global_batch_size"].integer(1, INT32_MAX);
  return t;
}

ManifestPiece parse_piece(const JsonIn& p, const std::set<std::string>& files) {
  ManifestPiece pc;
  pc.tensor = p["tensor"].string();
  if (pc.tensor.empty()) p["tensor"].error("empty tensor name");
  pc.kind = p["kind"].string();
  if (pc.kind != "param" && pc.kind != "exp_avg" && pc.kind != "exp_avg_sq")
    p["kind"].error("'", printable(pc.kind), "', expected param, exp_avg or exp_avg_sq");
  pc.file = p["file"].string();
  if (!files.count(pc.file))
    p["file"].error("'", printable(pc.file), "' is not listed in files (every file a piece reads must be ",
                    "listed with its size and CRC32)");
  pc.key = p["key"].string();
  const int64_t cap = kMaxCheckpointElements;
  int64_t logical_n = 0, local_n = 0;
  pc.logical = p["logical"].integers(1, 4, 0, cap);
  if (!numel_within(pc.logical, cap, &logical_n))
    p["logical"].error("shape ", shape_str(pc.logical), " has more than ", std::to_string(cap), " elements");
  pc.local = p["local"].integers(pc.logical.size(), pc.logical.size(), 0, cap);
  if (!numel_within(pc.local, cap, &local_n))
    p["local"].error("shape ", shape_str(pc.local), " has more than ", std::to_string(cap), " elements");
  pc.split_dim = static_cast<int>(p["split_dim"].integer(-1, 1));
  pc.shard_begin = p["shard_begin"].integer(0, cap);
  pc.shard_valid = p["shard_valid"].integer(0, cap);
  pc.elem_begin = p["elem_begin"].integer(0, local_n);
  pc.elem_end = p["elem_end"].integer(pc.elem_begin, local_n);
  if (pc.split_dim < 0) {
    if (pc.local != pc.logical)
      p["local"].error("shape ", shape_str(pc.local), " of a replicated tensor differs from its logical shape ",
                       shape_str(pc.logical));
    return pc;
  }
  const size_t d = static_cast<size_t>(pc.split_dim);
  if (pc.logical.size() != 2) p["split_dim"].error("only 2-D tensors are split, this one is ", shape_str(pc.logical));
  if (pc.local[1 - d] != pc.logical[1 - d])
    p["local"].error("shape ", shape_str(pc.local), " does not match logical shape ", shape_str(pc.logical),
                     " outside split dimension ", std::to_string(d));
  if (pc.shard_valid > pc.local[d] || pc.shard_begin + pc.shard_valid > pc.logical[d])
    p["shard_valid"].error("shard [", std::to_string(pc.shard_begin), ", +", std::to_string(pc.shard_valid),
                           ") does not fit the local ", shape_str(pc.local), " or logical ",
                           shape_str(pc.logical), " shape");
  return pc;
}

Fp8Record parse_fp8(const JsonIn& j, const std::set<std::string>& files) {
  Fp8Record r;
  r.mode = j["mode"].string();
  if (r.mode != "delayed" && r.mode != "blockwise")
    j["mode"].error("'", printable(r.mode), "', expected delayed or blockwise");
  r.scaling.history = static_cast<int>(j["amax_history"].integer(1, 1 << 20));
  r.scaling.margin = static_cast<int>(j["margin"].integer(0, 64));
  const std::string algo = j["amax_compute"].string();
  if (algo != "max" && algo != "most_recent") j["amax_compute"].error("'", printable(algo), "', expected max or most_recent");
  r.scaling.most_recent = algo == "most_recent";
  const JsonIn ts = j["tensors"];
  if (ts.size() > (size_t{1} << 24)) ts.error("has ", std::to_string(ts.size()), " entries, more than 2^24");
  std::set<std::string> seen;
  for (size_t i = 0; i < ts.size(); ++i) {
    const JsonIn t = ts.at(i);
    Fp8StateEntry e{t["name"].string(), t["file"].string(), t["key"].string()};
    if (e.name.empty() || !seen.insert(e.name).second) t["name"].error("'", printable(e.name), "' is empty or listed twice");
    if (!files.count(e.file)) t["file"].error("'", printable(e.file), "' is not listed in files");
    r.tensors.push_back(std::move(e));
  }
  if (r.mode == "blockwise" && !r.tensors.empty())
    ts.error("has ", std::to_string(r.tensors.size()), " entries; --fp8=blockwise keeps no scaling state");
  return r;
}

}  // namespace

uint32_t manifest_crc(const nlohmann::json& m) {
  nlohmann::json body = m;
  if (body.is_object()) body.erase("manifest_crc32");
  const std::string text = body.dump();
  return crc32(text.data(), text.size());
}

nlohmann::json make_manifest(const std::vector<nlohmann::json>& shards, const LlamaConfig& cfg,
                             const Layout& layout, const RunState& state,
                             const std::optional<OptimizerRecord>& optim) {
  nlohmann::json m = {
      {"format", kCheckpointFormat},
      {"step", state.step},
      {"tokens_seen", state.tokens_seen},
      {"data", {{"consumed_samples", state.consumed_samples}}},
      {"rng", {{"seed", state.seed}, {"kind", "counter-based (seed, tensor name, index)"}}},
      {"lr_schedule", {{"next_step", state.step}}},
      {"model", cfg.to_json()},
      {"layout", layout.to_json()},
      {"files", nlohmann::json::array()},
      {"tensors", nlohmann::json::array()}};
  const TrainingRecord& t = state.training;
  if (t.seq_len > 0)
    m["training"] = {{"seq_len", t.seq_len}, {"data_mode", t.data_mode},
                     {"micro_batch_size", t.micro_batch}, {"global_batch_size", t.global_batch}};
  if (!state.conversions.empty()) {
    m["conversions"] = nlohmann::json::array();
    for (const ConversionRecord& c : state.conversions)
      m["conversions"].push_back(
          {{"command", c.command}, {"from", c.from}, {"to", c.to}, {"source", c.source}, {"note", c.note}});
  }
  if (!state.ln_free.empty()) m["ln_free"] = state.ln_free.to_json();
  if (!state.fp8.empty()) {
    const Fp8ScalingConfig& c = state.fp8.scaling;
    nlohmann::json f = {{"mode", state.fp8.mode}, {"amax_history", c.history}, {"margin", c.margin},
                        {"amax_compute", c.most_recent ? "most_recent" : "max"}, {"tensors", nlohmann::json::array()}};
    for (const nlohmann::json& j : shards)
      if (j.contains("fp8"))
        for (const auto& t : j["fp8"]) f["tensors"].push_back(t);
    m["fp8"] = f;
  }
  if (optim)
    m["optimizer"] = {{"type", "adamw"}, {"steps_taken", optim->steps_taken},
                      {"beta1", optim->adam.beta1}, {"beta2", optim->adam.beta2},
                      {"eps", optim->adam.eps}, {"weight_decay", optim->adam.weight_decay}};
  // The depth each block was trained at (remove-layers keeps the original depths).
  nlohmann::json depths = nlohmann::json::array();
  for (int l = 0; l < cfg.num_layers; ++l) depths.push_back(cfg.depth_of(l));
  m["layer_depths"] = depths;
  for (nlohmann::json j : shards) {
    for (auto& pc : j["pieces"]) m["tensors"].push_back(pc);
    j.erase("pieces");
    j.erase("fp8");
    m["files"].push_back(j);
  }
  m["manifest_crc32"] = manifest_crc(m);
  return m;
}

Manifest parse_manifest(const nlohmann::json& m, const std::string& path) {
  const JsonIn in(m, path);
  in.require_object();
  const std::string format = in["format"].string();
  if (format != kCheckpointFormat)
    in["format"].error("'", printable(format), "', expected ", kCheckpointFormat);
  if (in["manifest_crc32"].uinteger(UINT32_MAX) != manifest_crc(m))
    fail(path, ": checksum mismatch: the manifest was edited or is corrupt");
  Manifest out;
  out.state.step = in["step"].integer(0, kMaxCount);
  out.state.tokens_seen = in["tokens_seen"].integer(0, INT64_MAX);
  out.state.consumed_samples = in["data"]["consumed_samples"].uinteger();
  out.state.seed = in["rng"]["seed"].uinteger();
  if (in.has("training")) out.state.training = parse_training(in["training"]);
  if (in.has("conversions")) {
    const JsonIn cs = in["conversions"];
    if (cs.size() > 1000) cs.error("has ", std::to_string(cs.size()), " records, more than 1000");
    for (size_t i = 0; i < cs.size(); ++i) {
      const JsonIn c = cs.at(i);
      c.require_object();
      out.state.conversions.push_back({c["command"].string(), c["from"].string(), c["to"].string(),
                                       c["source"].string(), c["note"].string()});
    }
  }
  out.model = LlamaConfig::from_json(in["model"].raw(), path + ": model");
  if (in.has("ln_free")) out.state.ln_free = LnFreeState::from_json(in["ln_free"], out.model.num_layers);
  out.layout = Layout::from_json(in["layout"], out.model.num_layers);
  if (in.has("optimizer")) out.optimizer = parse_optimizer(in["optimizer"]);

  const JsonIn files = in["files"];
  std::set<std::string> names;
  for (size_t i = 0; i < files.size(); ++i) {
    const JsonIn f = files.at(i);
    ManifestFile mf;
    mf.name = f["name"].string();
    if (!is_plain_file_name(mf.name))
      f["name"].error("'", printable(mf.name), "' is not a plain file name inside the checkpoint directory");
    if (!names.insert(mf.name).second) f["name"].error("'", printable(mf.name), "' is listed twice");
    mf.rank = static_cast<int>(f["rank"].integer(0, kMaxRanks));
    mf.bytes = f["bytes"].integer(0, kMaxCount);
    mf.crc32 = static_cast<uint32_t>(f["crc32"].uinteger(UINT32_MAX));
    out.files.push_back(std::move(mf));
  }
  if (in.has("fp8")) out.state.fp8 = parse_fp8(in["fp8"], names);
  const JsonIn tensors = in["tensors"];
  std::map<std::string, std::vector<int64_t>> logical_of;
  for (size_t i = 0; i < tensors.size(); ++i) {
    ManifestPiece pc = parse_piece(tensors.at(i), names);
    const auto [it, fresh] = logical_of.emplace(pc.tensor, pc.logical);
    if (!fresh && it->second != pc.logical)
      tensors.at(i)["logical"].error("shape ", shape_str(pc.logical), " of '", printable(pc.tensor),
                                     "' differs from ", shape_str(it->second), " in its other pieces");
    out.pieces.push_back(std::move(pc));
  }
  return out;
}

}  // namespace lns
