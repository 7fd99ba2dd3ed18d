// manifest.json of a checkpoint (docs/checkpoints.md): written and read here, in one
// place. Reading validates the whole document before anything else uses it: every
// field's type and range, file names that are plain names listed with size and CRC32,
// pieces whose shapes, shard ranges and element ranges lie inside their tensor and
// shard (overflow-safe), and the model config. Everything afterwards works on the
// typed, validated Manifest, never on the raw JSON.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "lns/model/config.h"
#include "lns/model/ln_free.h"
#include "lns/optim/optim.h"
#include "parallel/layout.h"

namespace lns {

constexpr const char* kCheckpointFormat = "lns-checkpoint-v1";
// No tensor or shard of a checkpoint is larger than this many elements.
constexpr int64_t kMaxCheckpointElements = int64_t{1} << 40;

// How the checkpoint was trained (lns_eval defaults to it); 0 / "" = not recorded
// (checkpoints written before it was, or imported weights).
struct TrainingRecord {
  int64_t seq_len = 0;
  std::string data_mode;  // "packed" | "document"
  int64_t micro_batch = 0, global_batch = 0;
};

// A conversion that changed what the model computes (lns_convert retrofit, import-hf
// --norm_scheme=lns): the manifest's "conversions", carried into every later
// checkpoint of the model (the trainer keeps them across resumes).
struct ConversionRecord {
  std::string command;   // "retrofit", "import-hf"
  std::string from, to;  // norm schemes
  std::string source;    // the input checkpoint or Hugging Face directory
  std::string note;      // what changed, in words
  bool operator==(const ConversionRecord&) const = default;
};

// The FP8 scaling state of an --fp8 run (manifest "fp8"; docs/fp8.md): the mode and
// scaling settings it was trained with, and where each FP8 tensor's state
// (Fp8DelayedScale::state: 3 + amax_history floats) is stored. Absent (mode empty) for
// runs without FP8 and for checkpoints lns_convert rewrote (which do not carry it).
struct Fp8StateEntry {
  std::string name, file, key;  // "model.layers.3.self_attn.q_proj.x", a listed file, its safetensors key
};
struct Fp8Record {
  std::string mode;  // "delayed"; empty: none recorded
  Fp8ScalingConfig scaling;
  std::vector<Fp8StateEntry> tensors;
  bool empty() const { return mode.empty(); }
};

// What the trainer needs back, besides tensors.
struct RunState {
  int64_t step = 0;             // optimizer steps taken
  int64_t tokens_seen = 0;
  uint64_t consumed_samples = 0;  // the data sampler's position
  uint64_t seed = 0;
  TrainingRecord training;
  std::vector<ConversionRecord> conversions;  // oldest first
  // LN-free fine-tuning: the norms whose divisors are constants and the schedule's
  // progress (manifest "ln_free", absent when empty). It changes what the model
  // computes, so every reader that runs the model applies it (apply_ln_free).
  LnFreeState ln_free;
  Fp8Record fp8;  // FP8 scaling state (--fp8): restored on resume
};

struct ManifestFile {
  std::string name;  // a plain file name inside the checkpoint directory
  int rank = 0;
  int64_t bytes = 0;
  uint32_t crc32 = 0;
};

// One contiguous run of elements [elem_begin, elem_end) of a rank's local (padded)
// copy of a logical tensor, stored flat under `key` in `file`.
struct ManifestPiece {
  std::string tensor, kind, file, key;  // kind: "param", "exp_avg", "exp_avg_sq"
  std::vector<int64_t> logical, local;
  int split_dim = -1;  // -1 replicated; 0 rows or 1 columns split (2-D tensors)
  int64_t shard_begin = 0, shard_valid = 0;
  int64_t elem_begin = 0, elem_end = 0;
  int64_t numel() const { return elem_end - elem_begin; }
};

struct OptimizerRecord {
  AdamWConfig adam;
  int64_t steps_taken = 0;
};

struct Manifest {
  RunState state;
  LlamaConfig model;
  Layout layout;  // the layout it was written under (parallel/layout.h)
  std::optional<OptimizerRecord> optimizer;  // absent for imported weights
  std::vector<ManifestFile> files;
  std::vector<ManifestPiece> pieces;
};

// The manifest document for rank files described by `shards` (each: rank, name,
// bytes, crc32, pieces, as write_rank_shard returns), with its own CRC32.
nlohmann::json make_manifest(const std::vector<nlohmann::json>& shards, const LlamaConfig& cfg,
                             const Layout& layout, const RunState& state,
                             const std::optional<OptimizerRecord>& optim);

// Validates `m` (read from `path`) completely; UserError naming `path` and the field.
Manifest parse_manifest(const nlohmann::json& m, const std::string& path);

// The CRC32 a manifest carries: of its compact dump without "manifest_crc32".
uint32_t manifest_crc(const nlohmann::json& m);

}  // namespace lns
