// Tensor parallelism: the context the model's TP layers use. Dimensions are split by
// the padding rule of parallel/shard.h; padding rows are zero and stay zero (their
// gradients are exactly zero; docs/parallelism.md). Checkpoints and dumps always hold
// the logical, unpadded shapes.
#pragma once
#include <cstdint>

#include "lns/tensor.h"
#include "parallel/communicator.h"
#include "parallel/shard.h"

namespace lns {

// What a model layer needs to know about its tensor-parallel group.
struct TensorParallel {
  int rank = 0, size = 1;
  Communicator* comm = nullptr;  // null when size == 1
  // Sum of the partial results of a row-parallel layer (forward) or of a
  // column-parallel layer's input gradient (backward), identical on every rank.
  void all_reduce_sum(Tensor t) const;
  void all_reduce_max(Tensor t) const;
};

}  // namespace lns
