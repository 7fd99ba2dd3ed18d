// The parallel layout, in one place. Megatron order: tensor-parallel rank innermost,
// then data-parallel, then pipeline outermost:
//
//     rank = tp_rank + dp_rank * TP + pp_rank * TP * DP
//
// Who owns what and when they talk:
//  - tp group (same dp, pp): splits attention heads, FFN width and vocabulary; one
//    all-reduce after o_proj and down_proj (forward) and after the q/k/v and
//    gate/up input gradients (backward); max/sum-exp all-reduces in the loss.
//  - dp group (same tp, pp): disjoint shares of every global batch; gradients summed
//    after backward (all-reduce, or reduce-scatter + all-gather with --zero=1).
//  - pipeline: stage s holds global layers [first_s, last_s); stage s sends
//    activations to the same (tp, dp) rank of stage s+1 and receives gradients back.
//  - embed group (tied embeddings, pp > 1): the first and the last stage of the same
//    (tp, dp) sum the embedding gradient so both copies stay equal.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lns/config.h"
#include "parallel/communicator.h"
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

  int rank = 0, world_size = 1;
  int tp = 1, pp = 1, dp = 1;
  int tp_rank = 0, dp_rank = 0, pp_rank = 0;

  int global_rank(int t, int d, int p) const { return t + d * tp + p * tp * dp; }
  bool first_stage() const { return pp_rank == 0; }
  // The ranks whose loss sums count once: the last stage's tensor-parallel rank 0 of
  // every data-parallel replica (tp ranks hold the same loss).
  bool reports_loss() const { return last_stage() && tp_rank == 0; }
  bool last_stage() const { return pp_rank == pp - 1; }
  int prev_stage_rank() const { return global_rank(tp_rank, dp_rank, pp_rank - 1); }
  int next_stage_rank() const { return global_rank(tp_rank, dp_rank, pp_rank + 1); }

  Communicator& world() { return *world_; }
  Communicator& tp_comm() { return *tp_; }
  Communicator& dp_comm() { return *dp_; }
  Communicator& embed_comm() { return *embed_; }  // 2 ranks when pp > 1, else 1
  TensorParallel tensor_parallel() { return {tp_rank, tp, tp > 1 ? tp_.get() : nullptr}; }

  // "world 8 = tp 2 x dp 2 x pp 2" and one line per stage with its global layers.
  std::string describe(const std::vector<std::pair<int, int>>& stage_layers) const;

 private:
  void build_communicators(bool device, CommKind comm);
  int tp_color_ = 0, dp_color_ = 0, embed_color_ = 0;  // MPI_Comm_split colors
  std::unique_ptr<Communicator> world_, tp_, dp_, embed_;
};

// The global layers [first, last) of every stage: an even split with the extra
// layers on the first stages, or the counts of --pp_layers=a,b,c. UserError when
// the counts do not add up or a stage would be empty.
std::vector<std::pair<int, int>> stage_layer_ranges(int num_layers, int pp,
                                                    const std::string& pp_layers);

// Start-up agreement, for apps: every rank calls this after its start-up with its
// error message ("" if none). If any rank failed, rank 0 prints the lowest failing
// rank's message as one line "<app>: error: <message> (rank r)" and every rank gets
// false (exit 1), instead of the healthy ranks waiting in their first collective.
// Needs MPI initialised; with one process it just prints.
bool all_ranks_started(const std::string& app, const std::string& error);

// Model constraints of a layout: heads and kv heads divisible by tp, no more stages
// than layers. UserError naming the flags.
void validate_layout(const LlamaConfig& cfg, int tp, int pp);

}  // namespace lns
