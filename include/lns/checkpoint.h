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
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lns/config.h"
#include "lns/optim.h"
#include "lns/param_set.h"
#include "parallel/communicator.h"

namespace lns {

// What the trainer needs back, besides tensors.
struct RunState {
  int64_t step = 0;             // optimizer steps taken
  int64_t tokens_seen = 0;
  uint64_t consumed_samples = 0;  // the data sampler's position
  uint64_t seed = 0;
};

struct CheckpointLayout {
  int tp = 1, pp = 1, dp = 1;
  bool zero = false;
  int tp_rank = 0, pp_rank = 0, dp_rank = 0;
  std::vector<std::pair<int, int>> stage_layers;
};

class TensorSource;

uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);
uint32_t file_crc32(const std::string& path);  // UserError naming the file if unreadable

// Collective over `world`. Writes out_dir/checkpoints/step_XXXXXXX and returns its
// path (on every rank). keep > 0 removes older complete checkpoints afterwards.
// pause_ms: test hook, each rank sleeps after writing its file (before the rename).
std::string save_checkpoint(const std::string& out_dir, Communicator& world, const ParamSet& params,
                            const AdamW& optim, const LlamaConfig& cfg, const CheckpointLayout& layout,
                            const RunState& state, int keep, int pause_ms = 0);

// The two halves of save_checkpoint, for tools that write a layout rank by rank in
// one process (lns_convert). write_rank_shard writes `rank`'s file into `dir` and
// returns its description (file, size, CRC32, pieces); optim may be null (no
// optimizer state). commit_checkpoint writes the manifest from every rank's
// description, fsyncs, renames dir (a .tmp) to final_dir and updates `latest`.
nlohmann::json write_rank_shard(const std::string& dir, int rank, const ParamSet& params,
                                const AdamW* optim, const CheckpointLayout& layout);
void commit_checkpoint(const std::string& tmp_dir, const std::string& final_dir,
                       const std::vector<nlohmann::json>& shards, const LlamaConfig& cfg,
                       const CheckpointLayout& layout, const RunState& state, const AdamW* optim,
                       int keep, bool update_latest = true);

// Writes the whole model from `src` as a checkpoint at out_dir for `layout` (rank by
// rank, in this process), with optimizer state when the source has it. Returns a
// one-line summary per rank file.
std::vector<std::string> write_checkpoint_from_source(const TensorSource& src, const LlamaConfig& cfg,
                                                      const CheckpointLayout& layout,
                                                      const std::string& pp_layers,
                                                      const RunState& state,
                                                      const AdamWConfig& adam, int64_t optim_steps,
                                                      const std::string& out_dir);

// The newest complete checkpoint under out_dir/checkpoints ("" if none). A
// directory without a valid manifest (an interrupted save) is skipped.
std::string find_latest_checkpoint(const std::string& out_dir);

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

// Fills params (a stage/shard of any layout) from the source's logical tensors, and
// the optimizer's moments when optim is given and the source has them.
void load_from_source(const TensorSource& src, ParamSet& params, AdamW* optim);

// A checkpoint opened for reading: manifest checked (its own checksum), every file
// checked (size and CRC32) before anything is read. UserError naming the file.
class Checkpoint : public TensorSource {
 public:
  explicit Checkpoint(const std::string& dir);
  const std::string& dir() const { return dir_; }
  const nlohmann::json& manifest() const { return manifest_; }
  LlamaConfig config() const;
  RunState run_state() const;
  // The logical tensor `name` of `kind` ("param", "exp_avg", "exp_avg_sq"),
  // assembled from its pieces; UserError if any element is missing.
  std::vector<float> logical(const std::string& name, const std::string& kind) const override;
  bool has(const std::string& name, const std::string& kind) const override;
  std::string where() const override { return dir_ + "/manifest.json"; }
  // Every parameter name in the checkpoint.
  std::vector<std::string> tensor_names() const;
  std::vector<int64_t> logical_shape(const std::string& name) const override;
  CheckpointLayout layout() const;

  // Fills `params` (a stage/shard of any layout) and, when given, the optimizer's
  // moments and step count. A checkpoint without optimizer state (imported weights)
  // leaves the moments at zero and the step count at 0.
  void load_into(ParamSet& params, AdamW* optim) const;
  bool has_optimizer_state() const;

 private:
  std::string dir_;
  nlohmann::json manifest_;
  std::multimap<std::string, nlohmann::json> pieces_;  // key: kind + "/" + name
};

}  // namespace lns
