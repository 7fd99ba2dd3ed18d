#include "lns/train/checkpoint_manager.h"

#include "absl/strings/str_format.h"
#include "lns/checkpoint/async_checkpoint.h"
#include "lns/core/errors.h"

namespace lns {

CheckpointManager::CheckpointManager(std::string out_dir, Communicator& world, int64_t save_every, int64_t steps,
                                     int keep, bool async, int pause_ms)
    : out_dir_(std::move(out_dir)), world_(world), save_every_(save_every), steps_(steps), keep_(keep),
      pause_ms_(pause_ms) {
  if (async && saves()) async_ = std::make_unique<AsyncCheckpointer>(out_dir_, world_, keep_, pause_ms_);
}

CheckpointManager::~CheckpointManager() = default;

void CheckpointManager::reserve(int64_t params, int64_t optim_range) {
  if (async_) async_->reserve(params, optim_range);
}

bool CheckpointManager::due(int64_t step) const {
  return saves() && save_every_ > 0 && step % save_every_ == 0 && step != steps_;
}

std::string CheckpointManager::save(const SaveContent& c, bool allow_async) {
  LNS_REQUIRE(saves(), "saving a checkpoint needs --out_dir");
  if (async_ && allow_async) return async_->start(c.params, c.optim, c.model, c.layout, c.at, c.state, c.fp8);
  if (async_)  // at most one save in flight, and this one is synchronous
    if (const std::string done = async_->finish(); !done.empty()) committed(c.state.step, done);
  return save_checkpoint(out_dir_, world_, c.params, c.optim, c.model, c.layout, c.at, c.state, keep_, pause_ms_,
                         c.fp8);
}

void CheckpointManager::poll(int64_t step) {
  if (!async_) return;
  if (const std::string done = async_->poll(); !done.empty()) committed(step, done);
}

void CheckpointManager::committed(int64_t step, const std::string& dir) {
  if (!root_) return;
  LOG(INFO) << absl::StrFormat("checkpoint %s committed (written in the background in %.1f s)", dir,
                               async_->last_write_s());
  if (metrics_)
    metrics_->write({{"step", step}, {"checkpoint_committed", dir}, {"save_write_s", async_->last_write_s()}});
}

}  // namespace lns
