#include "lns/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include <absl/strings/str_format.h>

#include "lns/errors.h"
#include "lns/safetensors.h"
#include "lns/stage.h"
#include "parallel/process_grid.h"

namespace fs = std::filesystem;

namespace lns {
namespace {

constexpr const char* kFormat = "lns-checkpoint-v1";

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return t;
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void write_synced(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    if (!f.flush()) fail(tmp, ": write failed");
  }
  fsync_path(tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail(path, ": rename failed");
}

std::string manifest_text_without_crc(nlohmann::json m) {
  m.erase("manifest_crc32");
  return m.dump();
}

int64_t cols_of(const std::vector<int64_t>& shape) { return shape.empty() ? 1 : shape.back(); }

}  // namespace

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  const auto& t = crc_table();
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = t[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t file_crc32(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, ": cannot read");
  std::vector<char> buf(1 << 20);
  uint32_t crc = 0;
  while (f) {
    f.read(buf.data(), buf.size());
    crc = crc32(buf.data(), static_cast<size_t>(f.gcount()), crc);
  }
  return crc;
}

nlohmann::json write_rank_shard(const std::string& dir, int rank, const ParamSet& params,
                                const AdamW* optim, const CheckpointLayout& layout) {
  // This rank's pieces: parameters from dp rank 0 (replicas are equal), moments from
  // every rank that owns an optimizer range (all dp ranks under ZeRO).
  SafetensorsWriter w;
  nlohmann::json pieces = nlohmann::json::array();
  const std::string file = absl::StrFormat("rank_%05d.safetensors", rank);
  for (int i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params.info(i);
    if (p.tied_copy || (p.replicated() && layout.tp_rank != 0)) continue;
    const int64_t n = p.shape.numel();
    auto add = [&](const std::string& kind, const float* data, int64_t eb, int64_t ee) {
      const std::string key = absl::StrFormat("%s/%s@%d", kind, p.name, eb);
      w.add_f32(key, {ee - eb}, data);
      pieces.push_back({{"tensor", p.name}, {"kind", kind}, {"file", file}, {"key", key},
                        {"logical", p.logical.to_vector()}, {"local", p.shape.to_vector()},
                        {"split_dim", p.split_dim}, {"shard_begin", p.shard_begin},
                        {"shard_valid", p.shard_valid}, {"elem_begin", eb}, {"elem_end", ee}});
    };
    if (layout.dp_rank == 0) add("param", params.host_param(i).f32(), 0, n);
    if (optim && (layout.zero || layout.dp_rank == 0)) {
      const int64_t lo = std::max<int64_t>(optim->begin(), p.offset),
                    hi = std::min<int64_t>(optim->end(), p.offset + n);
      if (lo < hi) {
        add("exp_avg", optim->exp_avg().f32() + (lo - optim->begin()), lo - p.offset, hi - p.offset);
        add("exp_avg_sq", optim->exp_avg_sq().f32() + (lo - optim->begin()), lo - p.offset, hi - p.offset);
      }
    }
  }
  const std::string path = dir + "/" + file;
  w.write(path);  // fsyncs
  return {{"rank", rank}, {"name", file}, {"bytes", static_cast<int64_t>(fs::file_size(path))},
          {"crc32", file_crc32(path)}, {"pieces", pieces}};
}

void commit_checkpoint(const std::string& tmp_dir, const std::string& final_dir,
                       const std::vector<nlohmann::json>& shards, const LlamaConfig& cfg,
                       const CheckpointLayout& layout, const RunState& state, const AdamW* optim,
                       int keep, bool update_latest) {
  nlohmann::json manifest = {
      {"format", kFormat},
      {"step", state.step},
      {"tokens_seen", state.tokens_seen},
      {"data", {{"consumed_samples", state.consumed_samples}}},
      {"rng", {{"seed", state.seed}, {"kind", "counter-based (seed, tensor name, index)"}}},
      {"lr_schedule", {{"next_step", state.step}}},
      {"model", cfg.to_json()},
      {"layout",
       {{"tp", layout.tp}, {"pp", layout.pp}, {"dp", layout.dp}, {"zero", layout.zero},
        {"stage_layers", layout.stage_layers}}},
      {"files", nlohmann::json::array()},
      {"tensors", nlohmann::json::array()}};
  if (optim)
    manifest["optimizer"] = {{"type", "adamw"}, {"steps_taken", optim->steps_taken()},
                             {"beta1", optim->config().beta1}, {"beta2", optim->config().beta2},
                             {"eps", optim->config().eps},
                             {"weight_decay", optim->config().weight_decay}};
  // The depth each block was trained at (remove-layers keeps the original depths).
  nlohmann::json depths = nlohmann::json::array();
  for (int l = 0; l < cfg.num_layers; ++l) depths.push_back(cfg.depth_of(l));
  manifest["layer_depths"] = depths;
  for (nlohmann::json j : shards) {
    for (auto& pc : j["pieces"]) manifest["tensors"].push_back(pc);
    j.erase("pieces");
    manifest["files"].push_back(j);
  }
  const std::string body = manifest_text_without_crc(manifest);
  manifest["manifest_crc32"] = crc32(body.data(), body.size());
  write_synced(tmp_dir + "/manifest.json", manifest.dump(1));
  fsync_path(tmp_dir);
  std::error_code ec;
  fs::remove_all(final_dir, ec);
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) fail(final_dir, ": cannot rename the finished checkpoint: ", ec.message());
  const fs::path root = fs::path(final_dir).parent_path();
  const std::string name = fs::path(final_dir).filename().string();
  fsync_path(root.string());
  if (!update_latest) return;
  write_synced((root / "latest").string(), name + "\n");
  if (keep > 0) {  // only complete checkpoints, oldest first; never the new one
    std::vector<std::string> done;
    for (const auto& e : fs::directory_iterator(root)) {
      const std::string n = e.path().filename().string();
      if (e.is_directory() && n.rfind("step_", 0) == 0 && n.find(".tmp") == std::string::npos &&
          fs::exists(e.path() / "manifest.json"))
        done.push_back(n);
    }
    std::sort(done.begin(), done.end());
    for (size_t k = 0; k + keep < done.size(); ++k)
      if (done[k] != name) fs::remove_all(root / done[k], ec);
  }
}

std::string save_checkpoint(const std::string& out_dir, Communicator& world, const ParamSet& params,
                            const AdamW& optim, const LlamaConfig& cfg, const CheckpointLayout& layout,
                            const RunState& state, int keep, int pause_ms) {
  const std::string root = out_dir + "/checkpoints";
  const std::string final_dir = root + "/" + absl::StrFormat("step_%07d", state.step);
  const std::string tmp_dir = final_dir + ".tmp";
  if (world.rank() == 0) {
    std::error_code ec;
    fs::create_directories(root, ec);
    if (ec) fail(root, ": cannot create checkpoint directory: ", ec.message());
    fs::remove_all(tmp_dir, ec);  // a save of this step that died earlier
    fs::create_directories(tmp_dir, ec);
    if (ec) fail(tmp_dir, ": cannot create: ", ec.message());
  }
  world.barrier();
  const nlohmann::json mine = write_rank_shard(tmp_dir, world.rank(), params, &optim, layout);
  if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  const std::string text = mine.dump();
  const auto all = world.gather_bytes(std::vector<char>(text.begin(), text.end()));
  if (world.rank() == 0) {
    std::vector<nlohmann::json> shards;
    for (const auto& b : all) shards.push_back(nlohmann::json::parse(std::string(b.begin(), b.end())));
    commit_checkpoint(tmp_dir, final_dir, shards, cfg, layout, state, &optim, keep);
  }
  world.barrier();
  return final_dir;
}

std::string find_latest_checkpoint(const std::string& out_dir) {
  const fs::path root = fs::path(out_dir) / "checkpoints";
  if (!fs::exists(root)) return "";
  std::string best;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    // A .tmp directory is a save that did not finish; never resume from it.
    if (e.is_directory() && n.rfind("step_", 0) == 0 && n.find(".tmp") == std::string::npos &&
        fs::exists(e.path() / "manifest.json") && n > best)
      best = n;
  }
  return best.empty() ? "" : (root / best).string();
}

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  const std::string mpath = dir + "/manifest.json";
  std::ifstream f(mpath);
  if (!f) fail(mpath, ": missing; ", dir, " is not a complete checkpoint");
  try {
    manifest_ = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail(mpath, ": not valid JSON (", e.what(), ")");
  }
  if (manifest_.value("format", "") != kFormat)
    fail(mpath, ": format '", manifest_.value("format", ""), "', expected ", kFormat);
  const std::string body = manifest_text_without_crc(manifest_);
  if (!manifest_.contains("manifest_crc32") ||
      manifest_["manifest_crc32"].get<uint32_t>() != crc32(body.data(), body.size()))
    fail(mpath, ": checksum mismatch: the manifest was edited or is corrupt");
  for (const auto& file : manifest_["files"]) {
    const std::string p = dir + "/" + file["name"].get<std::string>();
    if (!fs::exists(p)) fail(p, ": missing shard of checkpoint ", dir);
    const auto bytes = static_cast<int64_t>(fs::file_size(p));
    if (bytes != file["bytes"].get<int64_t>())
      fail(p, ": has ", bytes, " bytes, the manifest says ", file["bytes"].get<int64_t>(),
           " (truncated?)");
    if (file_crc32(p) != file["crc32"].get<uint32_t>())
      fail(p, ": checksum mismatch (corrupt shard)");
  }
  for (const auto& pc : manifest_["tensors"])
    pieces_.emplace(pc["kind"].get<std::string>() + "/" + pc["tensor"].get<std::string>(), pc);
}

LlamaConfig Checkpoint::config() const {
  LlamaConfig c = LlamaConfig::from_json(manifest_["model"], dir_ + "/manifest.json");
  return c;
}

RunState Checkpoint::run_state() const {
  RunState s;
  s.step = manifest_["step"].get<int64_t>();
  s.tokens_seen = manifest_["tokens_seen"].get<int64_t>();
  s.consumed_samples = manifest_["data"]["consumed_samples"].get<uint64_t>();
  s.seed = manifest_["rng"]["seed"].get<uint64_t>();
  return s;
}

bool Checkpoint::has(const std::string& name, const std::string& kind) const {
  return pieces_.count(kind + "/" + name) > 0;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> out;
  for (const auto& [key, pc] : pieces_)
    if (key.rfind("param/", 0) == 0) out.push_back(pc["tensor"].get<std::string>());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int64_t> Checkpoint::logical_shape(const std::string& name) const {
  auto it = pieces_.find("param/" + name);
  if (it == pieces_.end()) fail(dir_, "/manifest.json: no tensor '", name, "'");
  return it->second["logical"].get<std::vector<int64_t>>();
}

std::vector<float> Checkpoint::logical(const std::string& name, const std::string& kind) const {
  const auto [lo, hi] = pieces_.equal_range(kind + "/" + name);
  if (lo == hi) fail(dir_, "/manifest.json: no ", kind, " for tensor '", name, "'");
  const auto shape = lo->second["logical"].get<std::vector<int64_t>>();
  int64_t total = 1;
  for (int64_t d : shape) total *= d;
  const int64_t lcols = cols_of(shape);
  std::vector<float> out(total, 0.0f);
  int64_t covered = 0;
  std::map<std::string, std::unique_ptr<SafetensorsReader>> readers;
  for (auto it = lo; it != hi; ++it) {
    const nlohmann::json& pc = it->second;
    const std::string file = dir_ + "/" + pc["file"].get<std::string>();
    auto& r = readers[file];
    if (!r) r = std::make_unique<SafetensorsReader>(file);
    const std::vector<float> data = r->read_f32(pc["key"].get<std::string>());
    const auto local = pc["local"].get<std::vector<int64_t>>();
    const int split = pc["split_dim"].get<int>();
    const int64_t begin = pc["shard_begin"].get<int64_t>(), valid = pc["shard_valid"].get<int64_t>();
    const int64_t eb = pc["elem_begin"].get<int64_t>(), cols = cols_of(local);
    for (int64_t k = 0; k < static_cast<int64_t>(data.size()); ++k) {
      int64_t i = (eb + k) / cols, j = (eb + k) % cols;
      if (split == 0) {
        if (i >= valid) continue;  // padding
        i += begin;
      } else if (split == 1) {
        if (j >= valid) continue;
        j += begin;
      }
      out[i * lcols + j] = data[k];
      ++covered;
    }
  }
  if (covered != total)
    fail(dir_, "/manifest.json: ", kind, " of '", name, "' has ", covered, " of ", total,
         " elements in its pieces (a shard is missing or the manifest was edited)");
  return out;
}

bool Checkpoint::has_optimizer_state() const { return manifest_.contains("optimizer"); }

void Checkpoint::load_into(ParamSet& params, AdamW* optim) const {
  if (optim && !has_optimizer_state()) optim = nullptr;  // imported weights: fresh optimizer
  load_from_source(*this, params, optim);
  if (optim) optim->set_steps_taken(manifest_["optimizer"]["steps_taken"].get<int64_t>());
}

CheckpointLayout Checkpoint::layout() const {
  CheckpointLayout l;
  const auto& j = manifest_["layout"];
  l.tp = j["tp"], l.pp = j["pp"], l.dp = j["dp"], l.zero = j["zero"];
  l.stage_layers = j["stage_layers"].get<std::vector<std::pair<int, int>>>();
  return l;
}

void load_from_source(const TensorSource& src, ParamSet& params, AdamW* optim) {
  for (int i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params.info(i);
    if (!src.has(p.name, "param")) fail(src.where(), ": missing weight '", p.name, "'");
    const auto shape = src.logical_shape(p.name);
    if (Shape(shape) != p.logical)
      fail(src.where(), ": tensor '", p.name, "' has shape ", Shape(shape).str(),
           ", expected ", p.logical.str());
    const int64_t n = p.shape.numel(), cols = p.shape[p.shape.ndim - 1],
                  lcols = p.logical[p.logical.ndim - 1];
    // Local element k -> its logical index, or -1 for tensor-parallel padding.
    auto logical_index = [&](int64_t k) -> int64_t {
      int64_t li, lj;
      return p.to_logical(k / cols, k % cols, &li, &lj) ? li * lcols + lj : -1;
    };
    const std::vector<float> w = src.logical(p.name, "param");
    float* dst = params.host_param(i).f32();
    for (int64_t k = 0; k < n; ++k) dst[k] = logical_index(k) >= 0 ? w[logical_index(k)] : 0.0f;
    if (!optim || !src.has(p.name, "exp_avg")) continue;
    const int64_t lo = std::max<int64_t>(optim->begin(), p.offset),
                  hi = std::min<int64_t>(optim->end(), p.offset + n);
    if (lo >= hi) continue;
    for (const char* kind : {"exp_avg", "exp_avg_sq"}) {
      const std::vector<float> mom = src.logical(p.name, kind);
      float* out = (std::string(kind) == "exp_avg" ? optim->exp_avg() : optim->exp_avg_sq()).f32();
      for (int64_t k = lo - p.offset; k < hi - p.offset; ++k)
        out[p.offset + k - optim->begin()] = logical_index(k) >= 0 ? mom[logical_index(k)] : 0.0f;
    }
  }
  params.upload();  // CUDA: the host mirrors written above go to the device
  if (optim) optim->upload();
}

std::vector<std::string> write_checkpoint_from_source(const TensorSource& src, const LlamaConfig& cfg,
                                                      const CheckpointLayout& target,
                                                      const std::string& pp_layers,
                                                      const RunState& state,
                                                      const AdamWConfig& adam, int64_t optim_steps,
                                                      const std::string& out_dir) {
  validate_layout(cfg, target.tp, target.pp);
  CheckpointLayout layout = target;
  layout.stage_layers = stage_layer_ranges(cfg.num_layers, target.pp, pp_layers);
  const std::string tmp = out_dir + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) fail(tmp, ": cannot create: ", ec.message());
  const bool with_optim = src.has(LlamaStage::model_params(cfg).front().name, "exp_avg");
  std::vector<nlohmann::json> shards;
  std::vector<std::string> summary;
  for (int pr = 0; pr < layout.pp; ++pr)
    for (int dr = 0; dr < layout.dp; ++dr)
      for (int tr = 0; tr < layout.tp; ++tr) {
        layout.tp_rank = tr, layout.dp_rank = dr, layout.pp_rank = pr;
        const int rank = tr + dr * layout.tp + pr * layout.tp * layout.dp;
        const auto [first, last] = layout.stage_layers[pr];
        ParamSet ps = LlamaStage::stage_params(cfg, {first, last, pr == 0, pr == layout.pp - 1},
                                               {tr, layout.tp, nullptr});
        ps.finalize();
        std::unique_ptr<AdamW> optim;
        if (with_optim) {
          const ShardRange s = shard_range(ps.numel(), layout.dp, dr);
          optim = layout.zero ? std::make_unique<AdamW>(ps, adam, s.begin, s.begin + s.valid)
                              : std::make_unique<AdamW>(ps, adam);
          optim->set_steps_taken(optim_steps);
        }
        load_from_source(src, ps, optim.get());
        shards.push_back(write_rank_shard(tmp, rank, ps, optim.get(), layout));
        summary.push_back(absl::StrFormat("rank %d (tp %d, dp %d, pp %d: layers %d..%d): %s, %d bytes",
                                          rank, tr, dr, pr, first, last - 1,
                                          shards.back()["name"].get<std::string>(),
                                          shards.back()["bytes"].get<int64_t>()));
      }
  ParamSet empty;
  empty.finalize();
  AdamW steps_only(empty, adam);
  steps_only.set_steps_taken(optim_steps);
  commit_checkpoint(tmp, out_dir, shards, cfg, layout, state, with_optim ? &steps_only : nullptr,
                    0, /*update_latest=*/false);
  return summary;
}
}  // namespace lns
