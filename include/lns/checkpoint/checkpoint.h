// Sharded checkpoints (docs/checkpoints.md).
//
// Every rank writes the pieces of logical tensors it holds (its tensor-parallel shard
// of a parameter, its ZeRO range of the AdamW moments) to its own safetensors file;
// rank 0 writes manifest.json describing every piece, the run state and a CRC32 of
// every file. The step directory is written as step_XXXXXXX.tmp and renamed only
// after every rank has synced its file; `latest` is updated last. A loader of any
// layout assembles each logical tensor from the pieces and takes its own slice, so
// resuming under another (tp, pp, dp, zero) needs no conversion step.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lns/model/config.h"
#include "lns/checkpoint/manifest.h"
#include "lns/optim/optim.h"
#include "lns/model/param_set.h"
#include "parallel/communicator.h"

namespace lns {

class TensorSource;
class SafetensorsReader;

uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);
uint32_t file_crc32(const std::string& path);  // UserError naming the file if unreadable

// Collective over `world`. Writes out_dir/checkpoints/step_XXXXXXX and returns its
// path (on every rank), then points checkpoints/latest at it. A directory of the same
// name (a branch abandoned by a rollback) is moved aside, never deleted. keep > 0
// removes older complete checkpoints of ours afterwards (docs/checkpoints.md).
// pause_ms: test hook, each rank sleeps after writing its file (before the rename).
// fp8: this rank's FP8 scaling states (name, Fp8DelayedScale::state), written into its
// file and listed in the manifest's "fp8" record when state.fp8 names a mode.
using Fp8States = std::vector<std::pair<std::string, std::vector<float>>>;
std::string save_checkpoint(const std::string& out_dir, Communicator& world, const ParamSet& params,
                            const AdamW& optim, const LlamaConfig& cfg, const Layout& layout,
                            RankCoords at, const RunState& state, int keep, int pause_ms = 0,
                            const Fp8States& fp8 = {});

// Writes the file of the rank at `at` in `layout` into `dir` and returns its
// description (rank, name, bytes, CRC32, pieces) for the manifest; optim may be null
// (no optimizer state).
nlohmann::json write_rank_shard(const std::string& dir, const ParamSet& params, const AdamW* optim,
                                const Layout& layout, RankCoords at, const Fp8States& fp8 = {});
// What a rank's file holds, as host f32 buffers: its parameters, flat in the ParamSet's
// order [params.numel()], and its optimizer range's moments [optim_end - optim_begin].
// The live buffers (above), or a copy of them taken at a step boundary (--async_save,
// lns/checkpoint/async_checkpoint.h), which a background thread writes while training goes on.
struct ShardData {
  const float* params = nullptr;
  const float* exp_avg = nullptr;
  const float* exp_avg_sq = nullptr;
  int64_t optim_begin = 0, optim_end = 0;
  bool has_optim = false;
};
// As above, from `data`; `params` gives only the tensors' descriptions (names, shapes,
// offsets), which never change during a run.
nlohmann::json write_rank_shard(const std::string& dir, const ParamSet& params, const ShardData& data,
                                const Layout& layout, RankCoords at, const Fp8States& fp8 = {});

// The two ends of a save, shared by save_checkpoint and the asynchronous saver, both on
// rank 0 only. prepare_save_dir: creates out_dir/checkpoints/step_XXXXXXX.tmp afresh
// (a leftover of a save that died is removed) and returns it. commit_save: once every
// rank's file in it is durable (their descriptions in `shards`), writes the manifest,
// renames the directory to its final name, points `latest` at it and prunes to `keep`;
// returns the final directory. Until the rename, `latest` names the previous checkpoint.
std::string prepare_save_dir(const std::string& out_dir, int64_t step);
std::string commit_save(const std::string& out_dir, const std::vector<nlohmann::json>& shards,
                        const LlamaConfig& cfg, const Layout& layout, const RunState& state,
                        const OptimizerRecord& optim, int keep);

// Writes dir/manifest.json (atomically, then syncs the directory) for the rank files
// described by `shards`.
void write_manifest(const std::string& dir, const std::vector<nlohmann::json>& shards, const LlamaConfig& cfg,
                    const Layout& layout, const RunState& state, const std::optional<OptimizerRecord>& optim);

// Resharding (src/checkpoint/reshard.cpp).
// Writes the whole model from `src` as a checkpoint at out_dir for `layout` (sizes and
// zero; split by layout_for_model with pp_layers), rank by rank in this process, with
// optimizer state when the source has it. out_dir must
// not exist or be empty; with `overwrite` it may also be a complete lns checkpoint,
// which is replaced atomically. Returns a one-line summary per rank file.
std::vector<std::string> write_checkpoint_from_source(const TensorSource& src, const LlamaConfig& cfg,
                                                      const Layout& layout,
                                                      const std::string& pp_layers,
                                                      const RunState& state,
                                                      const AdamWConfig& adam, int64_t optim_steps,
                                                      const std::string& out_dir, bool overwrite = false);

// The checkpoint --resume=auto continues from: the one out_dir/checkpoints/latest
// names (UserError naming `latest` when that is missing or malformed); without a
// `latest` file, the newest complete step directory. "" when there is none. Newer
// step directories that `latest` does not name are ignored; `notes` says so.
std::string find_latest_checkpoint(const std::string& out_dir, std::vector<std::string>* notes = nullptr);

// For --overwrite: the files an lns checkpoint directory consists of (manifest.json
// and the files it lists), or nullopt with the reason.
std::optional<std::set<std::string>> checkpoint_inventory(const std::string& dir, std::string* why);

// Where logical tensors come from: a checkpoint, a Hugging Face directory, a view
// that renames layers. kind is "param", "exp_avg" or "exp_avg_sq".
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual bool has(const std::string& name, const std::string& kind) const = 0;
  virtual std::vector<float> logical(const std::string& name, const std::string& kind) const = 0;
  virtual std::vector<int64_t> logical_shape(const std::string& name) const = 0;
  virtual std::string where() const = 0;  // for errors
};

// Resharding (src/checkpoint/reshard.cpp): fills params (a stage/shard of any layout)
// from the source's logical tensors, and the optimizer's moments when optim is given
// and the source has them.
void load_from_source(const TensorSource& src, ParamSet& params, AdamW* optim);

// A checkpoint opened for reading. Before anything is read: the manifest is validated
// whole (parse_manifest), every file it lists is checked (a regular file, size and
// CRC32), every piece's safetensors entry exists with exactly its element count, and
// the tensors are exactly those of the model its config describes, with the shapes
// that config implies. UserError naming the file (and field).
class Checkpoint : public TensorSource {
 public:
  explicit Checkpoint(const std::string& dir);
  ~Checkpoint() override;
  const std::string& dir() const { return dir_; }
  const nlohmann::json& manifest() const { return manifest_; }  // the raw document
  const Manifest& info() const { return info_; }
  LlamaConfig config() const { return info_.model; }
  RunState run_state() const { return info_.state; }
  const Layout& layout() const { return info_.layout; }
  // The logical tensor `name` of `kind` ("param", "exp_avg", "exp_avg_sq"),
  // assembled from its pieces; UserError if an element is missing or covered twice.
  std::vector<float> logical(const std::string& name, const std::string& kind) const override;
  bool has(const std::string& name, const std::string& kind) const override;
  std::string where() const override { return dir_ + "/manifest.json"; }
  // Every parameter name in the checkpoint.
  std::vector<std::string> tensor_names() const;
  std::vector<int64_t> logical_shape(const std::string& name) const override;

  // Fills `params` (a stage/shard of any layout) and, when given, the optimizer's
  // moments and step count. A checkpoint without optimizer state (imported weights)
  // leaves the moments at zero and the step count at 0.
  void load_into(ParamSet& params, AdamW* optim) const;
  bool has_optimizer_state() const { return info_.optimizer.has_value(); }
  // The FP8 scaling state stored under `name` (a manifest "fp8" entry), or nullopt when
  // the checkpoint has none by that name. Its length is the caller's to check.
  std::optional<std::vector<float>> fp8_state(const std::string& name) const;

 private:
  std::string dir_;
  nlohmann::json manifest_;
  Manifest info_;
  std::multimap<std::string, size_t> pieces_;  // kind + "/" + name -> index into info_.pieces
  // by file name; fp8_state() opens a file no piece reads on first use
  mutable std::map<std::string, std::unique_ptr<SafetensorsReader>> readers_;
};

}  // namespace lns
