#include "parallel/tensor_parallel.h"

#include "lns/core/errors.h"

namespace lns {

void TensorParallel::all_reduce_sum(Tensor t) const {
  if (size > 1) comm->all_reduce(t, ReduceOp::Sum);
}

void TensorParallel::all_reduce_max(Tensor t) const {
  if (size > 1) comm->all_reduce(t, ReduceOp::Max);
}

void TensorParallel::reduce_scatter(Tensor out, Tensor full) const {
  LNS_CHECK(sequence_parallel && out.numel() * size == full.numel());
  comm->reduce_scatter(out, full);
}

void TensorParallel::all_gather(Tensor full, Tensor local) const {
  LNS_CHECK(sequence_parallel && local.numel() * size == full.numel());
  comm->all_gather(full, local);
}

}  // namespace lns
