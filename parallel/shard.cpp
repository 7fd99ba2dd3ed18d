#include "parallel/shard.h"

#include <algorithm>

namespace lns {

ShardRange shard_range(int64_t logical, int parts, int rank, int64_t align) {
  const int64_t size = (logical + parts - 1) / parts;
  const int64_t begin = size * rank;
  const int64_t stored = (size + align - 1) / align * align;
  return {begin, size, std::clamp<int64_t>(logical - begin, 0, size), stored};
}

}  // namespace lns
