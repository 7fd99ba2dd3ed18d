// AsyncCheckpointer: --async_save (docs/checkpoints.md, docs/resilience.md).
//
// At a step boundary each rank copies what its checkpoint file holds (parameters,
// moments, FP8 states) into host memory it owns (allocated once, before the first save)
// and hands the copy to a background
// thread, which writes and fsyncs the file while training goes on; the stall is the
// copy. The save is committed at a later step boundary, collectively: once every rank's
// thread has finished, rank 0 writes the manifest, renames the directory and moves
// `latest` (commit_save, the same code as a synchronous save). So every guarantee of a
// synchronous checkpoint holds: `latest` moves only once every rank's file is durable,
// a crash before that leaves the previous checkpoint the one `latest` names, and the
// files are the same bytes. At most one save is in flight: a new one, the end of the
// run and a stop on a signal first finish the one in flight. Only the main thread
// talks to other ranks (MPI is not used from the writer thread).
#pragma once
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "lns/checkpoint/checkpoint.h"

namespace lns {

class AsyncCheckpointer {
 public:
  // pause_ms: test hook, the writer sleeps this long after writing its file.
  AsyncCheckpointer(std::string out_dir, Communicator& world, int keep, int pause_ms = 0);
  ~AsyncCheckpointer();  // waits for the writer; never commits (the save stays a .tmp)
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  bool in_flight() const { return flight_ != nullptr; }
  // Allocates (and touches) the host buffers a save copies into: params floats and the
  // optimizer range's two moments. Done once before the first save (start() does it
  // otherwise, inside the stall); the buffers are kept from one save to the next.
  void reserve(int64_t params, int64_t optim_range);
  // Collective. Finishes a save in flight, then copies this rank's state (the host
  // buffers: the caller has downloaded and checked them) and starts writing it.
  // Returns the directory the checkpoint will have once committed.
  std::string start(const ParamSet& params, const AdamW& optim, const LlamaConfig& cfg, const Layout& layout,
                    RankCoords at, const RunState& state, const Fp8States& fp8);
  // Collective, at a step boundary: commits the save in flight when every rank's file
  // is written. Returns the committed directory, or "" (nothing to commit yet).
  // FaultError(kExitSaveFault) on every rank when a rank's writer failed.
  std::string poll();
  // Collective: waits for the save in flight and commits it ("" when none).
  std::string finish();
  // Seconds the last start() kept the caller (the copy), and the last committed
  // save's background write.
  double last_stall_s() const { return stall_s_; }
  double last_write_s() const { return write_s_; }

 private:
  struct Flight;
  std::string commit();
  std::string out_dir_;
  Communicator& world_;
  int keep_, pause_ms_;
  std::unique_ptr<Flight> flight_;
  std::vector<float> params_, exp_avg_, exp_avg_sq_;  // the copy a save writes: [numel], [range], [range]
  double stall_s_ = 0, write_s_ = 0;
};

}  // namespace lns
