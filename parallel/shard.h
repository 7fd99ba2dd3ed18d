// The one rule for splitting a dimension of `logical` elements over `parts` ranks,
// used for tensor-parallel shards (heads, FFN width, vocabulary) and for the ZeRO
// shard of a flat buffer alike.
//
// The dimension is padded to ceil(logical / parts) * parts; rank r holds indices
// [r * size, (r + 1) * size) of the padded dimension, of which the first `valid` are
// real. So a 5461-wide FFN or a 32001-token vocabulary splits over any tp, and every
// dp rank's optimizer shard has the same size (what reduce-scatter needs).
//
// A device may store more than `size`: `stored` is `size` rounded up to `align`
// elements (the rows past `size` are zero like the others past `valid`). On CUDA every
// tensor-parallel dimension that becomes a GEMM leading dimension is stored padded to
// gemm_dim_align() = 64 (lns/core/device.h), so F = 5461 is held as 5504 and its GEMMs get a
// row pitch Hopper's TMA kernels take. Which indices a rank owns (begin, size, valid)
// does not depend on `align`, so checkpoints, which hold `size` rows per piece, are the
// same from every device.
#pragma once
#include <cstdint>

namespace lns {

struct ShardRange {
  int64_t begin = 0;   // first padded index this rank holds
  int64_t size = 0;    // rows held (padded share)
  int64_t valid = 0;   // of which real: min(size, max(0, logical - begin))
  int64_t stored = 0;  // rows stored on the device: size rounded up to `align` (>= size)
  int64_t end() const { return begin + valid; }  // one past the last real index
};

ShardRange shard_range(int64_t logical, int parts, int rank, int64_t align = 1);

}  // namespace lns
