#include "parallel/tensor_parallel.h"

#include <algorithm>

namespace lns {

ShardRange shard_range(int64_t logical, int parts, int rank) {
  const int64_t size = (logical + parts - 1) / parts;
  const int64_t begin = size * rank;
  return {begin, size, std::clamp<int64_t>(logical - begin, 0, size)};
}

void TensorParallel::all_reduce_sum(Tensor t) const {
  if (size > 1) comm->all_reduce(t, ReduceOp::Sum);
}

void TensorParallel::all_reduce_max(Tensor t) const {
  if (size > 1) comm->all_reduce(t, ReduceOp::Max);
}

}  // namespace lns
