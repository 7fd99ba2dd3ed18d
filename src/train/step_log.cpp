#include "lns/train/step_log.h"
#include <algorithm>


#include "absl/strings/str_format.h"
#include "lns/core/progress.h"
#include "lns/train/trainer.h"

namespace lns {

StepLog::StepLog(const StepLogConfig& cfg, double start) : cfg_(cfg), start_(start) {}

nlohmann::json StepLog::record(const StepStats& s, double now, const StartupTimes* startup,
                               const std::vector<std::pair<std::string, double>>& comm) const {
  const double tps = cfg_.tokens_per_step / s.seconds;
  nlohmann::json j = {{"step", s.step}, {"loss", s.loss}, {"lr", s.lr},
                      {"grad_norm", s.grad_norm}, {"tokens_per_s", tps},
                      {"step_time_s", s.seconds}, {"elapsed_s", now - start_},
                      {"tokens", s.step * cfg_.tokens_per_step}, {"eta_s", eta_seconds(s.step)}};
  if (startup) {
    const StartupTimes& u = *startup;
    j["startup_s"] = {{"total", u.total()}, {"process", u.process}, {"data", u.data}, {"buffers", u.buffers},
                      {"weights", u.weights}, {"setup", u.setup}, {"first_step", u.first_step}};
  }
  if (cfg_.peak_tflops > 0)
    j["mfu"] = double(cfg_.flops_per_token) * cfg_.tokens_per_step / s.seconds /
               (cfg_.peak_tflops * 1e12 * cfg_.world);
  if (!comm.empty()) {
    nlohmann::json c = nlohmann::json::object();
    for (const auto& [kind, bytes] : comm) c[kind] = bytes;
    j["comm_bytes"] = c;
  }
  return j;
}

void StepLog::add(const StepStats& s) {
  window_time_ += s.seconds;
  window_tokens_ += cfg_.tokens_per_step;
  if (added_++ == 1) recent_.clear();  // the second step: the first one's start-up costs leave the mean
  recent_.push_back(s.seconds);
  if (recent_.size() > kEtaSteps) recent_.pop_front();
}

double StepLog::eta_seconds(int64_t step) const {
  if (recent_.empty()) return -1;
  double sum = 0;
  for (const double t : recent_) sum += t;
  return sum / double(recent_.size()) * double(std::max<int64_t>(cfg_.steps - step, 0));
}

bool StepLog::line_due(int64_t step) const {
  return step % cfg_.log_every == 0 || step == cfg_.steps || step == 1;
}

std::string StepLog::line(const StepStats& s, double now, const std::string& extra) {
  const double avg_tps = window_tokens_ / window_time_;
  std::string mfu;
  if (cfg_.peak_tflops > 0)
    mfu = absl::StrFormat(" | MFU %.1f%%", 100.0 * avg_tps * cfg_.flops_per_token / (cfg_.peak_tflops * 1e12 * cfg_.world));
  window_time_ = 0, window_tokens_ = 0;
  return absl::StrFormat("step %6d/%d | loss %.4f | lr %.3e | grad_norm %.3f | %.0f tok/s%s%s | %.1f s elapsed, ETA %s",
                         s.step, cfg_.steps, s.loss, s.lr, s.grad_norm, avg_tps, mfu, extra, now - start_,
                         format_duration(eta_seconds(s.step)));
}

}  // namespace lns
