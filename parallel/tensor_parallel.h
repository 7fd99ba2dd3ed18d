// Tensor parallelism: the padding rule and the context the model's TP layers use.
//
// A dimension of `logical` elements split over `parts` ranks is padded to
// ceil(logical / parts) * parts; rank r holds rows [r * size, (r + 1) * size) of the
// padded dimension, of which the first `valid` are real. Padding rows are zero and
// stay zero (their gradients are exactly zero; docs/parallelism.md), so a 5461-wide
// FFN or a 32001-token vocabulary splits over any tp. Checkpoints and dumps always
// hold the logical, unpadded shapes.
#pragma once
#include <cstdint>

#include "lns/tensor.h"
#include "parallel/communicator.h"

namespace lns {

struct ShardRange {
  int64_t begin = 0;  // first padded index this rank holds
  int64_t size = 0;   // rows held (padded share)
  int64_t valid = 0;  // of which real: min(size, max(0, logical - begin))
};

ShardRange shard_range(int64_t logical, int parts, int rank);

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
