#include "parallel/comm_activity.h"

#include <chrono>

#include "absl/strings/str_format.h"

namespace lns {

double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

CommActivity& CommActivity::process() {
  static CommActivity a;
  return a;
}

void CommActivity::begin(CommOp op) {
  op.since = monotonic_seconds();
  std::lock_guard<std::mutex> l(mu_);
  op_ = std::move(op);
  in_op_ = true;
}

void CommActivity::end() {
  const double now = monotonic_seconds();
  std::lock_guard<std::mutex> l(mu_);
  if (!in_op_) return;
  in_op_ = false;
  wait_s_ += now - op_.since;
  ++ops_done_;
}

CommActivity::Snapshot CommActivity::snapshot() const {
  const double now = monotonic_seconds();
  std::lock_guard<std::mutex> l(mu_);
  Snapshot s;
  s.in_op = in_op_, s.op = op_, s.ops_done = ops_done_;
  s.wait_s = wait_s_ + (in_op_ ? now - op_.since : 0.0);
  return s;
}

std::string CommActivity::describe(const CommOp& op) {
  if (op.kind.empty()) return "no communication yet";
  const std::string size = op.bytes >= (1 << 20) ? absl::StrFormat("%.1f MiB", op.bytes / 1048576.0)
                                                 : absl::StrFormat("%d B", op.bytes);
  if (op.peer >= 0)
    return absl::StrFormat("%s %s rank %d of %s (%s)", op.kind, op.kind == "recv" ? "from" : "to", op.peer,
                           op.group, size);
  return absl::StrFormat("%s on %s (%d ranks, %s)", op.kind, op.group, op.group_size, size);
}

}  // namespace lns
