// Communicator: the collectives and point-to-point messages the parallel layers use,
// independent of the transport (MPI here, NCCL in the CUDA backend). Model code sees
// only this interface. All operations are checked; a failure is fatal with the
// transport's message.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "lns/core/tensor.h"

namespace lns {

enum class ReduceOp { Sum, Max };

// What a communicator has moved, by collective kind (parallel/comm_counter.cpp).
// `bytes` are the bytes this rank sends under the ring algorithms NCCL uses (the
// "bus bytes" of nccl-tests), computed from each call's buffer of S bytes over p
// ranks: all-reduce 2(p-1)/p*S, all-gather and reduce-scatter (p-1)/p*S with S the
// full (gathered / unreduced) buffer, broadcast (p-1)/p*S, send S. A model of the
// wire, the same for every transport: our MPI all-reduce (reduce + broadcast, for
// identical bits on every rank) moves other amounts on other ranks.
enum class Collective { AllReduce, AllGather, ReduceScatter, Broadcast, Send, Reduce, kCount };
const char* collective_name(Collective k);  // "all_reduce", "all_gather", ...
struct CommCounts {
  static constexpr int kKinds = static_cast<int>(Collective::kCount);
  int64_t calls[kKinds] = {};
  double bytes[kKinds] = {};
  double total_bytes() const;
  CommCounts& operator+=(const CommCounts& o);
  CommCounts operator-(const CommCounts& o) const;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place over every rank; the result is bitwise identical on all ranks.
  virtual void all_reduce(Tensor t, ReduceOp op) = 0;
  virtual void all_reduce(double* v, int n, ReduceOp op) = 0;
  // out[size * n] = the n elements of `in` from rank 0, 1, ... in order.
  virtual void all_gather(Tensor out, Tensor in) = 0;
  // out[n] = sum over ranks of in[rank * n : (rank + 1) * n].
  virtual void reduce_scatter(Tensor out, Tensor in) = 0;
  virtual void broadcast(Tensor t, int root) = 0;
  // In place to one rank: `root`'s t becomes the sum over ranks; on the other ranks t
  // is only read (ncclReduce / MPI_Reduce). The ZeRO gradient sum: each piece of the
  // gradients goes to the rank that updates it.
  virtual void reduce(Tensor t, int root) = 0;
  // An in-place sum that may still be running when this returns (NCCL: on the
  // communicator's own stream, after the work already queued on the compute stream);
  // all_reduce_wait() orders everything queued afterwards behind every started sum.
  // The default sums at once, so callers need not care which kind they have.
  virtual void all_reduce_start(Tensor t) { all_reduce(t, ReduceOp::Sum); }
  // reduce(t, root) in the same way: queued beside compute, finished by all_reduce_wait().
  virtual void reduce_start(Tensor t, int root) { reduce(t, root); }
  // Waits for every started sum, all-reduce and reduce alike.
  virtual void all_reduce_wait() {}
  // True when started sums really run beside the compute stream (NCCL). NCCL does not
  // allow two communicators to have work in flight at once without an order between
  // them, so callers overlap only when no other communicator is used meanwhile.
  virtual bool overlaps_compute() const { return false; }
  // Non-blocking send: `t` must stay valid until wait_sends() returns.
  virtual void send(Tensor t, int peer, int tag) = 0;
  virtual void recv(Tensor t, int peer, int tag) = 0;
  virtual void wait_sends() = 0;
  virtual void barrier() = 0;
  // Rank 0 receives every rank's bytes in rank order; other ranks get nothing back.
  virtual std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine) = 0;
  // Totals since construction; zero unless wrapped by make_counting_communicator.
  virtual CommCounts counts() const { return {}; }
  // From another thread (the watchdog's), after a hang: make calls stuck in this
  // communicator return, so the process can end (NCCL: ncclCommAbort). The
  // communicator is unusable afterwards. Host (MPI) calls cannot be freed: no-op.
  virtual void abort() {}
  // Any thread: "" while the transport is healthy, else what failed (NCCL's
  // ncclCommGetAsyncError: a peer that died, a broken link). The watchdog polls it.
  virtual std::string async_error() { return ""; }

  double all_reduce_sum(double v) {
    all_reduce(&v, 1, ReduceOp::Sum);
    return v;
  }
};

// The one-rank communicator: every collective is the identity. Lets single-process
// code (tests, tools) run the same paths without MPI.
std::unique_ptr<Communicator> make_local_communicator();

// Wraps any communicator (MPI, NCCL, host staging) and counts what goes through it
// (CommCounts); every call is passed on unchanged, and recorded while it runs as the
// process's operation in flight under `group` (CommActivity, parallel/comm_activity.h).
// ProcessGrid wraps each group's.
std::unique_ptr<Communicator> make_counting_communicator(std::unique_ptr<Communicator> inner,
                                                         const std::string& group = "");

}  // namespace lns

namespace lns {

// Wraps a communicator that moves host memory (MPI) so that it also takes CUDA
// tensors: each is copied to a host buffer, exchanged, and copied back. bf16 tensors
// are reduced in f32 on the host and rounded once. Slow (two PCIe copies per
// collective) but works where NCCL cannot, e.g. several ranks sharing one GPU.
std::unique_ptr<Communicator> make_host_staging_communicator(std::unique_ptr<Communicator> inner);

// How ranks of a CUDA run talk: NCCL between GPUs, or MPI through host memory.
enum class CommKind { Mpi, Nccl };
// "mpi" or "nccl"; UserError naming --comm otherwise.
CommKind parse_comm(const std::string& value);

}  // namespace lns
