// CommActivity: what this process's communicators are doing, readable from another
// thread. The watchdog (parallel/watchdog.h) reports the operation a stuck rank waits
// in (kind, group, peer, bytes, for how long); the straggler detector separates the
// time a rank computes from the time it waits on communication. The counting
// communicator (make_counting_communicator, which ProcessGrid puts around every
// group's) records each call here; nothing else needs to.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>

namespace lns {

struct CommOp {
  std::string group;   // "tp", "dp", "embed", "world"
  std::string kind;    // collective_name(), or "recv", "wait_sends", "barrier", "gather_bytes"
  int peer = -1;       // point to point: the peer's rank in the group; -1 for collectives
  int group_size = 0;
  int64_t bytes = 0;   // the call's buffer
  double since = 0;    // monotonic seconds (now_seconds) when it began
};

class CommActivity {
 public:
  // The one record of this process (every communicator writes here).
  static CommActivity& process();

  // Called around every communicator call on the calling (main) thread. Calls do not
  // nest (the counting communicator is the outermost wrapper).
  void begin(CommOp op);
  void end();

  struct Snapshot {
    bool in_op = false;
    CommOp op;            // the call in flight when in_op, else the last one
    int64_t ops_done = 0;  // calls finished since start-up
    double wait_s = 0;     // seconds spent inside calls since start-up (the current one included)
  };
  Snapshot snapshot() const;  // any thread
  double wait_seconds() const { return snapshot().wait_s; }

  // "all_reduce on dp (4 ranks, 8.0 MiB)" or "recv from rank 3 of world (2.0 MiB)".
  static std::string describe(const CommOp& op);

 private:
  mutable std::mutex mu_;
  bool in_op_ = false;
  CommOp op_;
  int64_t ops_done_ = 0;
  double wait_s_ = 0;
};

// Monotonic seconds, the clock of CommOp::since.
double monotonic_seconds();

}  // namespace lns
