// CheckpointManager: when the trainer saves and how (docs/checkpoints.md): every
// --save_every steps (not the last, which the end of the run saves), synchronously, or
// in the background with --async_save (lns/checkpoint/async_checkpoint.h), whose commit it polls
// at every step boundary; what it records (metrics, log). The trainer hands it the state
// to save, already gathered to every rank's host and checked finite.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "lns/checkpoint/checkpoint.h"
#include "lns/train/metrics.h"

namespace lns {

class AsyncCheckpointer;

// What one save writes: this rank's part of the model and optimizer, and the run state.
struct SaveContent {
  const ParamSet& params;
  const AdamW& optim;
  const LlamaConfig& model;
  const Layout& layout;
  RankCoords at;
  RunState state;
  Fp8States fp8;
};

class CheckpointManager {
 public:
  // out_dir: the run directory ("" = no saves); save_every 0 = only at the end and on a
  // signal; keep and pause_ms as save_checkpoint's.
  CheckpointManager(std::string out_dir, Communicator& world, int64_t save_every, int64_t steps, int keep,
                    bool async, int pause_ms);
  ~CheckpointManager();
  bool saves() const { return !out_dir_.empty(); }
  bool async() const { return async_ != nullptr; }
  // --async_save: allocates the copy's host buffers now, outside every save's stall.
  void reserve(int64_t params, int64_t optim_range);
  // A periodic save is due after `step`.
  bool due(int64_t step) const;
  // Collective. allow_async: may run in the background (periodic saves); the end of the
  // run and a stop on a signal save synchronously, after the save in flight. Returns the
  // checkpoint's directory (final once committed).
  std::string save(const SaveContent& c, bool allow_async);
  // Where a committed background save is recorded (the run's metrics; rank 0 logs and
  // writes). Without, commits are not recorded.
  void record_to(Metrics* metrics, bool root) { metrics_ = metrics, root_ = root; }
  // Collective, at every step boundary with --async_save: commits the save in flight
  // once every rank's file is written.
  void poll(int64_t step);

 private:
  std::string out_dir_;
  Communicator& world_;
  int64_t save_every_, steps_;
  int keep_, pause_ms_;
  std::unique_ptr<AsyncCheckpointer> async_;
  Metrics* metrics_ = nullptr;
  bool root_ = false;
  void committed(int64_t step, const std::string& dir);  // log and record a background save's commit
};

}  // namespace lns
