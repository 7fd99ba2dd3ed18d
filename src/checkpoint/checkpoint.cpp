#include "lns/checkpoint/checkpoint.h"

#include <sys/stat.h>
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

#include "lns/core/errors.h"
#include "lns/core/files.h"
#include "lns/core/json_in.h"
#include "lns/core/output_dir.h"
#include "lns/checkpoint/safetensors.h"
#include "lns/model/stage.h"

namespace fs = std::filesystem;

namespace lns {
namespace {

constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 30;

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

// "step_0000300" -> 300; -1 for any other name (a .tmp save, a directory moved aside).
int64_t step_of_dir_name(const std::string& n) {
  if (n.size() < 6 || n.size() > 24 || n.rfind("step_", 0) != 0) return -1;
  int64_t step = 0;
  for (size_t i = 5; i < n.size(); ++i) {
    if (n[i] < '0' || n[i] > '9') return -1;
    step = step * 10 + (n[i] - '0');
  }
  return step;
}

// Complete checkpoints (a step directory with a manifest) under root, by step.
std::vector<std::pair<int64_t, std::string>> complete_step_dirs(const fs::path& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    const int64_t step = step_of_dir_name(n);
    if (step >= 0 && e.is_directory() && fs::exists(e.path() / "manifest.json")) out.emplace_back(step, n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A step_X.tmp left by a save that died: it may hold rank files, their temporary
// files and a manifest, all written by a save; anything else is not ours to delete.
void remove_interrupted_save(const std::string& dir) {
  std::set<std::string> ours;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    const bool rank_file = n.rfind("rank_", 0) == 0 && n.find(".safetensors") == 10;
    const bool manifest = n.rfind("manifest.json", 0) == 0;
    if (!(rank_file || manifest) || !e.is_regular_file() || e.is_symlink())
      fail(dir, ": left over from an interrupted save, but it holds '", printable(n),
           "', which a save does not write; move it away and restart");
    ours.insert(n);
  }
  if (!remove_owned_dir(dir, ours)) fail(dir, ": cannot remove this interrupted save");
}

// Keeps the newest `keep` complete checkpoints up to and including `newest`; removes
// older ones, each only after checking it holds nothing but its own files. Newer step
// directories (an abandoned branch) are left alone.
void prune_checkpoints(const fs::path& root, const std::string& newest, int keep) {
  const int64_t newest_step = step_of_dir_name(newest);
  std::vector<std::string> older;
  for (const auto& [step, n] : complete_step_dirs(root))
    if (step < newest_step) older.push_back(n);
  for (size_t k = 0; k + (keep - 1) < older.size(); ++k) {
    const std::string dir = (root / older[k]).string();
    std::string why;
    const auto files = checkpoint_inventory(dir, &why);
    if (!files || !remove_owned_dir(dir, *files))
      LOG(WARNING) << "--keep_checkpoints: keeping " << dir << ": it holds more than its checkpoint files"
                   << (why.empty() ? "" : " (" + why + ")");
  }
}

}  // namespace

void write_manifest(const std::string& dir, const std::vector<nlohmann::json>& shards, const LlamaConfig& cfg,
                    const Layout& layout, const RunState& state,
                    const std::optional<OptimizerRecord>& optim) {
  write_file_atomically(dir + "/manifest.json", make_manifest(shards, cfg, layout, state, optim).dump(1));
  fsync_path(dir);
}

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

nlohmann::json write_rank_shard(const std::string& dir, const ParamSet& params, const AdamW* optim,
                                const Layout& layout, RankCoords at, const Fp8States& fp8) {
  ShardData d;
  d.params = params.size() > 0 ? params.host_param(0).f32() - params.info(0).offset : nullptr;
  if (optim) {
    d.exp_avg = optim->exp_avg().f32(), d.exp_avg_sq = optim->exp_avg_sq().f32();
    d.optim_begin = optim->begin(), d.optim_end = optim->end(), d.has_optim = true;
  }
  return write_rank_shard(dir, params, d, layout, at, fp8);
}

nlohmann::json write_rank_shard(const std::string& dir, const ParamSet& params, const ShardData& data,
                                const Layout& layout, RankCoords at, const Fp8States& fp8) {
  const int rank = layout.rank_of(at);
  // This rank's pieces: parameters from dp rank 0 (replicas are equal), moments from
  // every rank that owns an optimizer range (all dp ranks under ZeRO).
  SafetensorsWriter w;
  nlohmann::json pieces = nlohmann::json::array();
  const std::string file = absl::StrFormat("rank_%05d.safetensors", rank);
  std::vector<float> packed;  // a whole tensor in the tp rule's layout (below)
  for (int i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params.info(i);
    if (!p.counted_on(at.tp)) continue;
    const int64_t n = p.shape.numel();
    // A whole tensor is written with the tp rule's extent (shard_size) along its split
    // dimension, not the device's stored one (parallel/shard.h): the checkpoint of a
    // CUDA run, whose FFN and vocabulary shards are stored padded to 64, has the same
    // bytes as the CPU's. A part of a tensor (a ZeRO range) keeps the stored layout,
    // which the manifest describes ("local"); readers take either.
    Shape piece = p.shape;
    if (!p.replicated()) piece.dims[p.split_dim] = p.shard_size;
    auto add = [&](const std::string& kind, const float* data, int64_t eb, int64_t ee) {
      Shape local = p.shape;
      if (eb == 0 && ee == n && piece != p.shape) {  // drop the stored padding past shard_size
        const int64_t rows = piece[0], cols = piece.ndim > 1 ? piece[1] : 1, stride = p.shape.ndim > 1 ? p.shape[1] : 1;
        packed.resize(rows * cols);
        for (int64_t r = 0; r < rows; ++r) std::copy(data + r * stride, data + r * stride + cols, &packed[r * cols]);
        data = packed.data(), local = piece, ee = piece.numel();
      }
      const std::string key = absl::StrFormat("%s/%s@%d", kind, p.name, eb);
      w.add_f32(key, {ee - eb}, data);
      pieces.push_back({{"tensor", p.name}, {"kind", kind}, {"file", file}, {"key", key},
                        {"logical", p.logical.to_vector()}, {"local", local.to_vector()},
                        {"split_dim", p.split_dim}, {"shard_begin", p.shard_begin},
                        {"shard_valid", p.shard_valid}, {"elem_begin", eb}, {"elem_end", ee}});
    };
    if (at.dp == 0) add("param", data.params + p.offset, 0, n);
    if (data.has_optim && (layout.zero || at.dp == 0)) {
      const int64_t lo = std::max<int64_t>(data.optim_begin, p.offset),
                    hi = std::min<int64_t>(data.optim_end, p.offset + n);
      if (lo < hi) {
        add("exp_avg", data.exp_avg + (lo - data.optim_begin), lo - p.offset, hi - p.offset);
        add("exp_avg_sq", data.exp_avg_sq + (lo - data.optim_begin), lo - p.offset, hi - p.offset);
      }
    }
  }
  nlohmann::json fp8_entries = nlohmann::json::array();
  for (const auto& [name, state] : fp8) {
    const std::string key = "fp8/" + name;
    w.add_f32(key, {static_cast<int64_t>(state.size())}, state.data());
    fp8_entries.push_back({{"name", name}, {"file", file}, {"key", key}});
  }
  const std::string path = dir + "/" + file;
  w.write(path);  // fsyncs
  return {{"rank", rank}, {"name", file}, {"bytes", static_cast<int64_t>(fs::file_size(path))},
          {"crc32", file_crc32(path)}, {"pieces", pieces}, {"fp8", fp8_entries}};
}

std::string prepare_save_dir(const std::string& out_dir, int64_t step) {
  const fs::path root = fs::path(out_dir) / "checkpoints";
  const std::string tmp_dir = (root / absl::StrFormat("step_%07d", step)).string() + ".tmp";
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) fail(root.string(), ": cannot create checkpoint directory: ", ec.message());
  if (fs::exists(tmp_dir)) remove_interrupted_save(tmp_dir);  // a save of this step that died
  fs::create_directory(tmp_dir, ec);
  if (ec) fail(tmp_dir, ": cannot create: ", ec.message());
  return tmp_dir;
}

std::string commit_save(const std::string& out_dir, const std::vector<nlohmann::json>& shards,
                        const LlamaConfig& cfg, const Layout& layout, const RunState& state,
                        const OptimizerRecord& optim, int keep) {
  const fs::path root = fs::path(out_dir) / "checkpoints";
  const std::string name = absl::StrFormat("step_%07d", state.step);
  const std::string final_dir = (root / name).string();
  const std::string tmp_dir = final_dir + ".tmp";
  write_manifest(tmp_dir, shards, cfg, layout, state, optim);
  if (fs::exists(final_dir)) {  // a branch abandoned by a rollback: kept, out of the way
    const std::string aside = move_aside(final_dir, "superseded");
    LOG(WARNING) << final_dir << " existed (not the checkpoint `latest` named); moved it to " << aside;
  }
  if (std::rename(tmp_dir.c_str(), final_dir.c_str()) != 0)
    fail(final_dir, ": cannot rename the finished checkpoint: ", std::strerror(errno));
  fsync_path(root.string());
  write_file_atomically((root / "latest").string(), name + "\n");
  fsync_path(root.string());
  if (keep > 0) prune_checkpoints(root, name, keep);
  return final_dir;
}

std::string save_checkpoint(const std::string& out_dir, Communicator& world, const ParamSet& params,
                            const AdamW& optim, const LlamaConfig& cfg, const Layout& layout,
                            RankCoords at, const RunState& state, int keep, int pause_ms,
                            const Fp8States& fp8) {
  const std::string final_dir =
      (fs::path(out_dir) / "checkpoints" / absl::StrFormat("step_%07d", state.step)).string();
  const std::string tmp_dir = final_dir + ".tmp";
  // The run directory is locked: no other writer is here.
  if (world.rank() == 0) prepare_save_dir(out_dir, state.step);
  world.barrier();
  const nlohmann::json mine = write_rank_shard(tmp_dir, params, &optim, layout, at, fp8);
  if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  const std::string text = mine.dump();
  const auto all = world.gather_bytes(std::vector<char>(text.begin(), text.end()));
  if (world.rank() == 0) {
    std::vector<nlohmann::json> shards;
    for (const auto& b : all) shards.push_back(nlohmann::json::parse(std::string(b.begin(), b.end())));
    commit_save(out_dir, shards, cfg, layout, state, OptimizerRecord{optim.config(), optim.steps_taken()}, keep);
  }
  world.barrier();
  return final_dir;
}

std::string find_latest_checkpoint(const std::string& out_dir, std::vector<std::string>* notes) {
  const fs::path root = fs::path(out_dir) / "checkpoints";
  if (!fs::is_directory(root)) return "";
  const std::string latest = (root / "latest").string();
  const auto done = complete_step_dirs(root);
  auto note = [&](const std::string& n) {
    if (notes) notes->push_back(n);
  };
  if (!fs::exists(latest)) {
    if (done.empty()) return "";
    note(absl::StrCat("no ", latest, "; using the newest complete checkpoint, ", done.back().second));
    return (root / done.back().second).string();
  }
  std::string name = read_file(latest, 4096, "`latest` file");
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ' || name.back() == '\r')) name.pop_back();
  const int64_t step = step_of_dir_name(name);
  if (step < 0) fail(latest, ": names '", printable(name), "', expected a checkpoint directory name like step_0000300");
  const fs::path dir = root / name;
  if (!fs::is_directory(dir)) fail(latest, ": names ", name, ", but ", dir.string(), " does not exist");
  if (!fs::exists(dir / "manifest.json"))
    fail(latest, ": names ", name, ", but ", dir.string(), " has no manifest.json (not a complete checkpoint)");
  for (const auto& [s, n] : done)
    if (s > step)
      note(absl::StrCat("ignoring ", (root / n).string(), ": newer than ", name, ", which `latest` names (a ",
                        "branch abandoned by a rollback, or a save that stopped before updating `latest`)"));
  return dir.string();
}

std::optional<std::set<std::string>> checkpoint_inventory(const std::string& dir, std::string* why) {
  const std::string mpath = dir + "/manifest.json";
  if (!fs::exists(mpath)) {
    *why = "no manifest.json";
    return std::nullopt;
  }
  try {
    const nlohmann::json m = parse_json_file(mpath, kMaxManifestBytes, "checkpoint manifest");
    if (!m.is_object() || m.value("format", "") != kCheckpointFormat) {
      *why = mpath + " is not an " + kCheckpointFormat + " manifest";
      return std::nullopt;
    }
    std::set<std::string> names = {"manifest.json"};
    const JsonIn files = JsonIn(m, mpath)["files"];
    for (size_t i = 0; i < files.size(); ++i) {
      const std::string n = files.at(i)["name"].string();
      if (!is_plain_file_name(n)) files.at(i)["name"].error("not a plain file name");
      names.insert(n);
    }
    return names;
  } catch (const UserError& e) {
    *why = e.what();
    return std::nullopt;
  }
}

Checkpoint::~Checkpoint() = default;

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  const std::string mpath = dir + "/manifest.json";
  if (!fs::exists(mpath)) fail(mpath, ": missing; ", dir, " is not a complete checkpoint");
  manifest_ = parse_json_file(mpath, kMaxManifestBytes, "checkpoint manifest");
  info_ = parse_manifest(manifest_, mpath);
  // Every listed file, before any is read: a regular file in this directory, with the
  // size and CRC32 the manifest records.
  for (const ManifestFile& file : info_.files) {
    const std::string p = dir + "/" + file.name;
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) fail(p, ": missing shard of checkpoint ", dir);
    if (!S_ISREG(st.st_mode)) fail(p, ": not a regular file (a checkpoint's shards are plain files in its directory)");
    if (st.st_size != file.bytes)
      fail(p, ": has ", static_cast<int64_t>(st.st_size), " bytes, the manifest says ", file.bytes, " (truncated?)");
    if (file_crc32(p) != file.crc32) fail(p, ": checksum mismatch (corrupt shard)");
  }
  // Every piece's entry: present, a float type, exactly the piece's element count.
  for (size_t i = 0; i < info_.pieces.size(); ++i) {
    const ManifestPiece& pc = info_.pieces[i];
    auto& r = readers_[pc.file];
    if (!r) r = std::make_unique<SafetensorsReader>(dir + "/" + pc.file);
    const SafetensorEntry* e = r->find(pc.key);
    if (!e) fail(mpath, ": tensors[", i, "].key: '", printable(pc.key), "' is not in ", pc.file);
    if (!is_float_dtype(e->dtype) || e->numel() != pc.numel())
      fail(mpath, ": tensors[", i, "]: ", pc.file, " holds '", printable(pc.key), "' as ", e->dtype, " ",
           Shape(e->shape).str(), ", the piece needs ", pc.numel(), " float elements");
    pieces_.emplace(pc.kind + "/" + pc.tensor, i);
  }
  // The tensors are exactly the model's, with the shapes its config implies, so that a
  // model built from the config (before any weight is read) fits them.
  std::set<std::string> model_names;
  for (const ParamInfo& p : LlamaStage::model_params(info_.model)) {
    model_names.insert(p.name);
    auto it = pieces_.find("param/" + p.name);
    if (it == pieces_.end()) fail(mpath, ": has no weight '", p.name, "', which its model config implies");
    const auto& shape = info_.pieces[it->second].logical;
    if (Shape(shape) != p.logical)
      fail(mpath, ": tensor '", p.name, "' has shape ", Shape(shape).str(), ", its model config implies ",
           p.logical.str());
    for (const char* kind : {"exp_avg", "exp_avg_sq"})
      if (has(p.name, kind) != has_optimizer_state())
        fail(mpath, ": ", has_optimizer_state() ? "has no " : "has optimizer state ", kind, " for '", p.name,
             has_optimizer_state() ? "' although it records optimizer state" : "' but no optimizer record");
  }
  for (const ManifestPiece& pc : info_.pieces)
    if (!model_names.count(pc.tensor))
      fail(mpath, ": has tensor '", printable(pc.tensor), "', which the model of its config does not have");
}

std::optional<std::vector<float>> Checkpoint::fp8_state(const std::string& name) const {
  for (const Fp8StateEntry& e : info_.state.fp8.tensors) {
    if (e.name != name) continue;
    auto& r = readers_[e.file];  // the file's size and CRC32 were checked on opening
    if (!r) r = std::make_unique<SafetensorsReader>(dir_ + "/" + e.file);
    const SafetensorEntry* t = r->find(e.key);
    if (!t || t->dtype != "F32" || t->shape.size() != 1)
      fail(dir_, "/manifest.json: fp8 state '", printable(name), "' is not a 1-D F32 entry '", printable(e.key),
           "' of ", e.file);
    return r->read_f32(e.key);
  }
  return std::nullopt;
}

bool Checkpoint::has(const std::string& name, const std::string& kind) const {
  return pieces_.count(kind + "/" + name) > 0;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> out;
  for (const auto& [key, i] : pieces_)
    if (key.rfind("param/", 0) == 0) out.push_back(info_.pieces[i].tensor);
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int64_t> Checkpoint::logical_shape(const std::string& name) const {
  auto it = pieces_.find("param/" + name);
  if (it == pieces_.end()) fail(dir_, "/manifest.json: no tensor '", name, "'");
  return info_.pieces[it->second].logical;
}

std::vector<float> Checkpoint::logical(const std::string& name, const std::string& kind) const {
  const auto [lo, hi] = pieces_.equal_range(kind + "/" + name);
  if (lo == hi) fail(dir_, "/manifest.json: no ", kind, " for tensor '", name, "'");
  const std::vector<int64_t>& shape = info_.pieces[lo->second].logical;
  const int64_t total = Shape(shape).numel(), lcols = shape.back();
  std::vector<float> out(total, 0.0f);
  std::vector<bool> seen(total, false);  // every element exactly once
  int64_t covered = 0;
  for (auto it = lo; it != hi; ++it) {
    const ManifestPiece& pc = info_.pieces[it->second];
    const std::vector<float> data = readers_.at(pc.file)->read_f32(pc.key);  // numel checked at open
    const int64_t cols = pc.local.back(), begin = pc.shard_begin, valid = pc.shard_valid;
    for (int64_t k = 0; k < static_cast<int64_t>(data.size()); ++k) {
      const int64_t flat = pc.elem_begin + k;
      int64_t dst = flat;  // replicated: local == logical
      if (pc.split_dim >= 0) {
        int64_t i = flat / cols, j = flat % cols;
        if ((pc.split_dim == 0 ? i : j) >= valid) continue;  // tensor-parallel padding
        (pc.split_dim == 0 ? i : j) += begin;
        dst = i * lcols + j;
      }
      LNS_CHECK(dst >= 0 && dst < total) << "parse_manifest must keep pieces inside their tensor";
      if (seen[dst])
        fail(dir_, "/manifest.json: ", kind, " of '", name, "': pieces overlap at element ", dst,
             " (the manifest was edited or is corrupt)");
      seen[dst] = true;
      out[dst] = data[k];
      ++covered;
    }
  }
  if (covered != total)
    fail(dir_, "/manifest.json: ", kind, " of '", name, "' has ", covered, " of ", total,
         " elements in its pieces (a shard is missing or the manifest was edited)");
  return out;
}

void Checkpoint::load_into(ParamSet& params, AdamW* optim) const {
  if (optim && !has_optimizer_state()) optim = nullptr;  // imported weights: fresh optimizer
  load_from_source(*this, params, optim);
  if (optim) optim->set_steps_taken(info_.optimizer->steps_taken);
}

}  // namespace lns
