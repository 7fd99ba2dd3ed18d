// The run directory (--out_dir) of lns_train, and its rules (docs/training.md):
//  - one run at a time: the run holds an exclusive lock on OUT_DIR/.lock for its
//    whole life (flock: the kernel releases it when the process dies, however);
//  - a directory holds one run: a fresh start (no --resume) is refused where another
//    run left checkpoints or metrics;
//  - metrics.jsonl has one record per step: a resumed run first drops the records of
//    steps after the checkpoint it resumed from (they are about to be redone).
#pragma once
#include <cstdint>
#include <string>

namespace lns {

class RunDirLock {
 public:
  // Takes the lock (creating out_dir and .lock if needed) and records this process
  // ("pid 1234 on host h") in it. UserError naming out_dir and the holder when another
  // process holds it. A filesystem without flock gets a warning and no lock.
  explicit RunDirLock(const std::string& out_dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

// UserError when out_dir already holds another run's checkpoints or metrics (a fresh
// start there would mix two runs, and its first save would bury the other's).
void check_fresh_run_dir(const std::string& out_dir);

// Rewrites `path` (atomically) keeping only the records with "step" <= `step`, and
// drops lines that are not JSON objects with a step (a line cut by a crash). Returns
// the number of lines dropped; a missing file is 0.
int64_t truncate_metrics(const std::string& path, int64_t step);

}  // namespace lns
