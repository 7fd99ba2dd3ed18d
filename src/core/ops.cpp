// The rules of the ops (lns/core/ops.h) that hold on every device, asked by their dispatch
// or by the backends.
#include <cmath>

#include "lns/core/errors.h"
#include "lns/core/ops.h"

namespace lns {

bool FixedDivisor::uses_pos0(int64_t n) const {
  return fixed_uses_pos0(row0 + n, T, eot >= 0 ? ids.i32()[n] : 0, eot);
}

void check_fixed_divisor(const FixedDivisor& d) {
  // The constants come from calibration or a checkpoint: bad ones are the input's fault.
  LNS_REQUIRE(d.pos0 > 0.0f && d.rest > 0.0f && std::isfinite(d.pos0) && std::isfinite(d.rest),
              "--ln_free: fixed divisors must be finite and > 0, got ", d.pos0, " and ", d.rest);
  LNS_CHECK(d.T > 0 && d.row0 >= 0);
}

}  // namespace lns
