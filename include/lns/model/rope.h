// Rotary embedding tables, computed once per run in double precision.
#pragma once
#include "lns/core/tensor.h"

namespace lns {

struct RopeTable {
  OwnedTensor cos, sin;  // [T, D/2]: angle(t, j) = t * theta^(-2j/D)
  RopeTable(int64_t seq_len, int64_t head_dim, double theta);
};

}  // namespace lns
