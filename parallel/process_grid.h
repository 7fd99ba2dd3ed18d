// ProcessGrid: this rank's place in the layout (parallel/layout.h, where the rank
// order and every other rule of the layout live) plus the communicators of its
// groups: tp, dp, the embedding pair of tied embeddings, and the world.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/layout.h"
#include "parallel/tensor_parallel.h"

namespace lns {

class ProcessGrid {
 public:
  // From MPI_COMM_WORLD, with MPI communicators for host tensors; UserError when
  // tp * pp does not divide the world size.
  static std::unique_ptr<ProcessGrid> create_mpi(int tp, int pp);
  // CUDA runs, after every rank has bound its GPU: communicators that take device
  // tensors, NCCL (comm = Nccl) or MPI with host staging (comm = Mpi, which also
  // lets several ranks share one GPU). Collective over the world.
  void use_device_communicators(CommKind comm);
  // One process, no MPI.
  static std::unique_ptr<ProcessGrid> single();

  // The sizes come from the world; the stage split and --zero are filled in by the
  // model side (layout_for_model) before anything asks for them.
  Layout layout;
  RankCoords coords;  // this rank's
  int rank = 0;

  int world_size() const { return layout.world_size(); }
  bool first_stage() const { return layout.first_stage(coords.pp); }
  bool last_stage() const { return layout.last_stage(coords.pp); }
  // The ranks whose loss sums count once: the last stage's tensor-parallel rank 0 of
  // every data-parallel replica (tp ranks hold the same loss).
  bool reports_loss() const { return last_stage() && coords.tp == 0; }
  int prev_stage_rank() const { return layout.rank_of({coords.tp, coords.dp, coords.pp - 1}); }
  int next_stage_rank() const { return layout.rank_of({coords.tp, coords.dp, coords.pp + 1}); }
  std::pair<int, int> stage_range() const { return layout.stage_range(coords.pp); }

  Communicator& world() { return *world_; }
  Communicator& tp_comm() { return *tp_; }
  Communicator& dp_comm() { return *dp_; }
  Communicator& embed_comm() { return *embed_; }  // 2 ranks when pp > 1, else 1
  TensorParallel tensor_parallel() {
    return {coords.tp, layout.tp, layout.tp > 1 ? tp_.get() : nullptr, layout.sequence_parallel_on()};
  }

  // What this rank has sent since start-up, by group and collective kind (the ring
  // model of CommCounts): "tp", "dp", "embed", "world" (losses, norms, flags) and
  // "pp" (the pipeline's activations and gradients, sent over the world). Groups of
  // one rank count nothing. Subtract two readings for one step.
  std::vector<std::pair<std::string, CommCounts>> comm_counts() const;
  // Any thread: Communicator::abort on every group's communicator (the watchdog's hook).
  void abort_communicators();
  // Any thread: the first group's Communicator::async_error ("" when all are healthy).
  std::string communicator_error();

 private:
  void build_communicators(bool device, CommKind comm);
  int tp_color_ = 0, dp_color_ = 0, embed_color_ = 0;  // MPI_Comm_split colors
  std::unique_ptr<Communicator> world_, tp_, dp_, embed_;
};

// Start-up agreement, for apps: every rank calls this after its start-up with its
// error message ("" if none). If any rank failed, rank 0 prints the lowest failing
// rank's message as one line "<app>: error: <message> (rank r)" and every rank gets
// false (exit 1), instead of the healthy ranks waiting in their first collective.
// Needs MPI initialised; with one process it just prints.
bool all_ranks_started(const std::string& app, const std::string& error);

}  // namespace lns
