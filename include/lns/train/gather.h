// Assembling logical tensors on rank 0 from the pieces ranks hold: tensor-parallel
// shards (with padding to drop), pipeline stages, data-parallel batch shares. Used by
// step dumps, and by anything that needs "the single-rank tensor" under a layout.
#pragma once
#include <array>
#include <map>
#include <string>
#include <vector>

#include "lns/model/param_set.h"
#include "lns/core/tensor.h"
#include "parallel/communicator.h"

namespace lns {

struct TensorPiece {
  std::string name;
  Shape logical;                 // the whole tensor
  std::array<int64_t, kMaxDims> offset{};  // where this piece starts in it
  Shape valid;                   // the piece's extent (the local tensor may be larger)
  Tensor local;                  // CPU, contiguous; F32 or I32
};

// The piece of parameter i's gradient (grads = true) or value this rank holds, or
// nothing when another rank is the one to report it (replicas on tp rank > 0, the
// last stage's tied copy).
bool param_piece(const ParamSet& params, int i, bool grads, int tp_rank, TensorPiece* out);

// Every rank calls this with its pieces; rank 0 gets the assembled tensors by name
// (each element written by exactly one piece), other ranks an empty map.
std::map<std::string, OwnedTensor> gather_to_root(Communicator& world,
                                                  const std::vector<TensorPiece>& mine);

}  // namespace lns
