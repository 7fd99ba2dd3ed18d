#include <cmath>

#include "lns/model/rope.h"

namespace lns {

RopeTable::RopeTable(int64_t T, int64_t D, double theta)
    : cos(DType::F32, Shape{T, D / 2}), sin(DType::F32, Shape{T, D / 2}) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < D / 2; ++j) {
      const double angle = t * std::pow(theta, -2.0 * j / D);
      cos.f32()[t * (D / 2) + j] = static_cast<float>(std::cos(angle));
      sin.f32()[t * (D / 2) + j] = static_cast<float>(std::sin(angle));
    }
}

}  // namespace lns
