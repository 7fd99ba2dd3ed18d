#include "lns/train/straggler.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lns/core/errors.h"

namespace lns {

void StragglerConfig::validate() const {
  LNS_REQUIRE(every >= 0, "--straggler_every must be >= 0 steps (0: off), got ", every);
  LNS_REQUIRE(std::isfinite(threshold) && threshold > 0 && threshold <= 100,
              "--straggler_threshold must be a fraction > 0 (0.2: 20% slower than the median), got ", threshold);
  LNS_REQUIRE(windows >= 1 && windows <= 1000, "--straggler_windows must be between 1 and 1000, got ", windows);
}

std::vector<double> straggler_slowdowns(const std::vector<double>& compute_s, const std::vector<int>& group) {
  std::map<int, std::vector<double>> by_group;
  for (size_t r = 0; r < compute_s.size(); ++r) by_group[group[r]].push_back(compute_s[r]);
  std::map<int, double> median;
  for (auto& [g, v] : by_group) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    median[g] = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  }
  std::vector<double> out(compute_s.size(), 0.0);
  for (size_t r = 0; r < compute_s.size(); ++r) {
    const double m = median[group[r]];
    if (by_group[group[r]].size() > 1 && m > 0) out[r] = compute_s[r] / m;
  }
  return out;
}

StragglerDetector::StragglerDetector(const StragglerConfig& cfg, const ProcessGrid& grid)
    : cfg_(cfg), rank_(grid.rank), world_(grid.world_size()), streak_(world_, 0) {
  cfg_.validate();
  const Layout& l = grid.layout;
  const bool per_stage = l.tp * l.dp > 1;  // a stage with one rank has no peers of its own
  group_.resize(world_);
  for (int r = 0; r < world_; ++r) group_[r] = per_stage ? l.coords_of(r).pp : 0;
}

void StragglerDetector::add_step(double step_s, double wait_s) {
  last_compute_ = std::max(0.0, step_s - wait_s);
  window_compute_ += last_compute_;
  ++window_steps_;
}

nlohmann::json StragglerDetector::end_window(Communicator& world, int64_t step) {
  if (hosts_.empty()) {  // once: every rank's host, on rank 0
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    const std::string mine(host);
    for (const auto& h : world.gather_bytes(std::vector<char>(mine.begin(), mine.end())))
      hosts_.emplace_back(h.begin(), h.end());
    hosts_.resize(world_, "?");
  }
  std::vector<double> c(world_, 0.0);
  c[rank_] = window_steps_ > 0 ? window_compute_ / window_steps_ : 0.0;  // seconds per step
  world.all_reduce(c.data(), world_, ReduceOp::Sum);
  window_compute_ = 0, window_steps_ = 0;
  const std::vector<double> slow = straggler_slowdowns(c, group_);
  nlohmann::json named = nlohmann::json::array();
  for (int r = 0; r < world_; ++r) {
    streak_[r] = slow[r] > 1 + cfg_.threshold ? streak_[r] + 1 : 0;
    if (streak_[r] < cfg_.windows) continue;
    std::vector<double> peers;
    for (int q = 0; q < world_; ++q)
      if (group_[q] == group_[r]) peers.push_back(c[q]);
    const double median = c[r] / slow[r];
    named.push_back({{"rank", r}, {"host", hosts_[r]}, {"compute_s", c[r]}, {"median_s", median},
                     {"slowdown", slow[r]}, {"windows", streak_[r]}});
    if (rank_ == 0)
      LOG(WARNING) << absl::StrFormat(
          "straggler: rank %d (host %s) computes %.2fx the median of its %s (%.4f s against %.4f s per step) "
          "for %d windows of %d steps in a row, up to step %d",
          r, hosts_[r], slow[r], group_[r] == 0 && peers.size() == size_t(world_) ? "world" : "pipeline stage",
          c[r], median, streak_[r], cfg_.every, step);
  }
  if (rank_ != 0) return {};
  const auto [lo, hi] = std::minmax_element(c.begin(), c.end());
  nlohmann::json rec = {{"step", step},
                        {"compute_s", {{"min", *lo}, {"max", *hi}, {"slowest_rank", int(hi - c.begin())}}},
                        {"stragglers", named}};
  if (world_ <= 256) rec["rank_compute_s"] = c;
  return rec;
}

}  // namespace lns
