// Counter-based random numbers: value i of stream `key` is a pure function of
// (key, i), so any slice of a tensor can be generated without the rest. That makes
// initialisation independent of the parallel layout: a tensor-parallel shard or a
// pipeline stage draws exactly the numbers the single-rank model would.
#pragma once
#include <cstdint>
#include <string_view>

namespace lns {

uint64_t splitmix64(uint64_t x);
// Stream key for a named tensor under a run seed.
uint64_t rng_key(uint64_t seed, std::string_view name);
// Uniform in (0, 1), 24 bits of mantissa, never 0.
float uniform_at(uint64_t key, uint64_t i);
// Standard normal (Box-Muller on the pair (2*(i/2), 2*(i/2)+1)).
float normal_at(uint64_t key, uint64_t i);
// normal_at(key, i) and normal_at(key, i + 1) for an even i, from one Box-Muller draw
// (the same bits as the two calls, half the work: initialisation draws billions).
void normal_pair_at(uint64_t key, uint64_t i, float* at_i, float* at_i_plus_1);
// out[i] = mean + std * normal_at(key, i) for i < n, the threads splitting the pairs: the
// same numbers whatever the thread count (lns_bench_kernels' operands, hundreds of
// millions of values).
void fill_normal(float* out, int64_t n, float mean, float std, uint64_t key);

}  // namespace lns
