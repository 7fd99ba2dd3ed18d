#include "parallel/tensor_parallel.h"

namespace lns {

void TensorParallel::all_reduce_sum(Tensor t) const {
  if (size > 1) comm->all_reduce(t, ReduceOp::Sum);
}

void TensorParallel::all_reduce_max(Tensor t) const {
  if (size > 1) comm->all_reduce(t, ReduceOp::Max);
}

}  // namespace lns
