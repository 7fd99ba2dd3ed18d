#include "lns/train/step_guard.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_format.h"
#include "lns/core/errors.h"

namespace lns {

StepGuard::StepGuard(double spike_factor, int window) : factor_(spike_factor), window_(window) {
  LNS_REQUIRE(std::isfinite(spike_factor) && (spike_factor == 0 || spike_factor > 1),
              "--spike_factor must be 0 (off) or > 1 (a multiple of the running median loss), got ", spike_factor);
  LNS_REQUIRE(window >= 1 && window <= 100000, "--spike_window must be between 1 and 100000 steps, got ", window);
}

namespace {

double median_of(const std::deque<double>& d) {
  std::vector<double> v(d.begin(), d.end());
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace

std::string StepGuard::suspicious(double loss, double grad_norm) const {
  if (!std::isfinite(loss)) return absl::StrFormat("non-finite loss %g", loss);
  if (!std::isfinite(grad_norm)) return absl::StrFormat("non-finite gradient norm %g", grad_norm);
  if (factor_ > 0 && losses_.size() >= window_) {
    const double m = median_of(losses_);
    if (loss > factor_ * m)
      return absl::StrFormat("loss spike %.4f > %.1f x the running median %.4f of the last %d steps", loss,
                             factor_, m, window_);
    const double n = median_of(norms_);
    if (grad_norm > factor_ * n)
      return absl::StrFormat("gradient norm spike %.4g > %.1f x the running median %.4g of the last %d steps",
                             grad_norm, factor_, n, window_);
  }
  return "";
}

void StepGuard::accept(double loss, double grad_norm) {
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) return;
  losses_.push_back(loss), norms_.push_back(grad_norm);
  while (losses_.size() > window_) losses_.pop_front(), norms_.pop_front();
}

uint64_t fingerprint_words(const void* data, int64_t words, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0xcbf29ce484222325ull ^ (seed * 0x9e3779b97f4a7c15ull);
  for (int64_t i = 0; i < words; ++i) {
    uint32_t w;
    std::memcpy(&w, p + 4 * i, 4);
    h = (h ^ w) * 0x100000001b3ull;
  }
  return h;
}

}  // namespace lns
