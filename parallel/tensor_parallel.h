// Tensor parallelism: the context the model's TP layers use. Dimensions are split by
// the padding rule of parallel/shard.h; padding rows are zero and stay zero (their
// gradients are exactly zero; docs/parallelism.md). Checkpoints and dumps always hold
// the logical, unpadded shapes.
#pragma once
#include <cstdint>

#include "lns/core/tensor.h"
#include "parallel/communicator.h"
#include "parallel/shard.h"

namespace lns {

// What a model layer needs to know about its tensor-parallel group.
struct TensorParallel {
  int rank = 0, size = 1;
  Communicator* comm = nullptr;  // null when size == 1
  // Sequence parallelism (Layout::sequence_parallel_on): between the tensor-parallel
  // linears each rank holds only its contiguous share of the micro-batch's tokens
  // (sequence_shard); the all-reduces become a reduce-scatter after the row-parallel
  // linears and an all-gather before the column-parallel ones.
  bool sequence_parallel = false;
  // Sum of the partial results of a row-parallel layer (forward) or of a
  // column-parallel layer's input gradient (backward), identical on every rank.
  void all_reduce_sum(Tensor t) const;
  void all_reduce_max(Tensor t) const;
  // Sequence parallelism: full [N, C] <-> this rank's [N / size, C] rows.
  // out = this rank's rows of the sum over ranks of `full` (partial results).
  void reduce_scatter(Tensor out, Tensor full) const;
  // full = every rank's rows in rank order.
  void all_gather(Tensor full, Tensor local) const;
  // Tokens of a micro-batch of `tokens` this rank holds in the split regions (all of
  // them without sequence parallelism), and the first of them.
  // The rule is Layout::sequence_shard's (the split of parallel/shard.h).
  ShardRange token_shard(int64_t tokens) const {
    return sequence_parallel ? shard_range(tokens, size, rank) : ShardRange{0, tokens, tokens, tokens};
  }
};

}  // namespace lns
