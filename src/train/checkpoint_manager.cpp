#include "lns/checkpoint_manager.h"

#include "absl/strings/str_format.h"
#include "lns/async_checkpoint.h"
#include "lns/errors.h"

namespace lns {

CheckpointManager::CheckpointManager(std::string out_dir, Communicator& world, int64_t save_every, int64_t steps,
                                     int keep, bool async, int pause_ms)
    : out_dir_(std::move(out_dir)), world_(world), save_every_(save_every), steps_(steps), keep_(keep),
      pause_ms_(pause_ms) {
  if (async && saves()) async_ = std::make_unique<AsyncCheckpointer>(out_dir_, world_, keep_, pause_ms_);
}

CheckpointManager::~CheckpointManager() = default;

bool CheckpointManager::due(int64_t step) const {
  return saves() && save_every_ > 0 && step % save_every_ == 0 && step != steps_;
}

std::string CheckpointManager::save(const SaveContent& c, bool allow_async) {
  LNS_REQUIRE(saves(), "saving a checkpoint needs --out_dir");
  if (async_ && allow_async) return async_->start(c.params, c.optim, c.model, c.layout, c.at, c.state, c.fp8);
  if (async_) async_->finish();  // at most one save in flight, and this one is synchronous
  return save_checkpoint(out_dir_, world_, c.params, c.optim, c.model, c.layout, c.at, c.state, keep_, pause_ms_,
                         c.fp8);
}

void CheckpointManager::poll(int64_t step, Metrics& metrics, bool root) {
  if (!async_) return;
  const std::string done = async_->poll();
  if (done.empty() || !root) return;
  LOG(INFO) << absl::StrFormat("checkpoint %s committed (written in the background in %.1f s)", done,
                               async_->last_write_s());
  metrics.write({{"step", step}, {"checkpoint_committed", done}, {"save_write_s", async_->last_write_s()}});
}

}  // namespace lns
