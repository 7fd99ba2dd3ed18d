#include "lns/core/rng.h"

#include <cmath>

namespace lns {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t rng_key(uint64_t seed, std::string_view name) {
  uint64_t h = splitmix64(seed);
  for (unsigned char c : name) h = splitmix64(h ^ c);  // FNV-like chaining, mixed well
  return h;
}

float uniform_at(uint64_t key, uint64_t i) {
  const uint64_t bits = splitmix64(key ^ splitmix64(i));
  return (static_cast<float>(bits >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

namespace {
// Box-Muller in double so the result does not depend on libm's float paths: the
// radius and angle of the pair (2k, 2k+1).
void box_muller(uint64_t key, uint64_t pair, double* r, double* a) {
  const double u1 = uniform_at(key, pair);
  const double u2 = uniform_at(key, pair + 1);
  *r = std::sqrt(-2.0 * std::log(u1));
  *a = 2.0 * M_PI * u2;
}
}  // namespace

float normal_at(uint64_t key, uint64_t i) {
  double r, a;
  box_muller(key, i & ~uint64_t{1}, &r, &a);
  return static_cast<float>((i & 1) ? r * std::sin(a) : r * std::cos(a));
}

void normal_pair_at(uint64_t key, uint64_t i, float* at_i, float* at_i_plus_1) {
  double r, a;
  box_muller(key, i, &r, &a);
  *at_i = static_cast<float>(r * std::cos(a));
  *at_i_plus_1 = static_cast<float>(r * std::sin(a));
}

void fill_normal(float* out, int64_t n, float mean, float std, uint64_t key) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i += 2) {
    float a, b;
    normal_pair_at(key, uint64_t(i), &a, &b);
    out[i] = mean + std * a;
    if (i + 1 < n) out[i + 1] = mean + std * b;
  }
}

}  // namespace lns
