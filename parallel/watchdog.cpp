#include "parallel/watchdog.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lns/core/errors.h"
#include "lns/core/exit_status.h"
#include "parallel/comm_activity.h"

namespace fs = std::filesystem;

namespace lns {
namespace {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string rank_file(const std::string& dir, int rank) { return absl::StrFormat("%s/rank_%05d.json", dir, rank); }

// tmp + rename, no fsync: a heartbeat is rewritten every few seconds and only its
// freshness matters; a reader sees the old record or the new one, never half of one.
void write_small_file(const std::string& path, const std::string& text) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) return;  // a full or unreachable disk must not end training: the next beat retries
    f << text;
    if (!f) return;
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
}

}  // namespace

const char* section_name(Section s) {
  switch (s) {
    case Section::None: return "none";
    case Section::Setup: return "set-up";
    case Section::Step: return "step";
    case Section::Save: return "checkpoint save";
    case Section::Load: return "checkpoint load";
    case Section::Eval: return "evaluation";
    case Section::kCount: break;
  }
  return "?";
}

void WatchdogConfig::validate() const {
  auto nonneg = [](double v, const char* flag) {
    LNS_REQUIRE(std::isfinite(v) && v >= 0, "--", flag, " must be a number of seconds >= 0 (0: no timeout), got ", v);
  };
  nonneg(setup_s, "timeout_setup_s"), nonneg(step_s, "timeout_step_s"), nonneg(save_s, "timeout_save_s");
  nonneg(load_s, "timeout_load_s"), nonneg(eval_s, "timeout_eval_s");
  LNS_REQUIRE(std::isfinite(auto_factor) && (auto_factor == 0 || auto_factor >= 1),
              "--timeout_step_auto_factor must be 0 (off) or >= 1 (a multiple of the median step), got ", auto_factor);
  nonneg(auto_floor_s, "timeout_step_floor_s");
  LNS_REQUIRE(auto_warmup >= 1, "--timeout_step_warmup must be >= 1 step, got ", auto_warmup);
  LNS_REQUIRE(std::isfinite(heartbeat_s) && heartbeat_s >= 0.05 && heartbeat_s <= 3600,
              "--heartbeat_s must be between 0.05 and 3600 seconds, got ", heartbeat_s);
}

bool heartbeat_fresh(const nlohmann::json& hb, double now_unix, double heartbeat_s) {
  if (!hb.is_object() || !hb.contains("updated_unix") || !hb["updated_unix"].is_number()) return false;
  return now_unix - hb["updated_unix"].get<double>() <= 3 * heartbeat_s + 1;
}

std::vector<Culprit> find_culprits(const std::vector<nlohmann::json>& hbs, double now, double heartbeat_s) {
  std::vector<Culprit> out;
  auto host_of = [](const nlohmann::json& h) {
    return h.is_object() && h.contains("host") && h["host"].is_string() ? h["host"].get<std::string>() : "?";
  };
  auto num = [](const nlohmann::json& h, const char* k, double dflt) {
    return h.is_object() && h.contains(k) && h[k].is_number() ? h[k].get<double>() : dflt;
  };
  bool anyone_waits = false;
  std::vector<int> fresh;
  for (size_t r = 0; r < hbs.size(); ++r) {
    const nlohmann::json& h = hbs[r];
    if (!h.is_object()) {
      out.push_back({int(r), "?", "no heartbeat file (never started, or its run directory is not shared)"});
    } else if (!heartbeat_fresh(h, now, heartbeat_s)) {
      out.push_back({int(r), host_of(h),
                     absl::StrFormat("no heartbeat for %.1f s (process stopped or dead) in %s, step %d",
                                     now - num(h, "updated_unix", 0), h.value("section", "?"),
                                     int64_t(num(h, "step", 0)))});
    } else {
      fresh.push_back(int(r));
      anyone_waits |= h.value("in_op", false);
    }
  }
  // A rank that computes while others wait for it is stuck in its computation.
  if (anyone_waits)
    for (int r : fresh)
      if (!hbs[r].value("in_op", false))
        out.push_back({r, host_of(hbs[r]),
                       absl::StrFormat("computing in %s, step %d, for %.1f s while other ranks wait",
                                       hbs[r].value("section", "?"), int64_t(num(hbs[r], "step", 0)),
                                       num(hbs[r], "section_for_s", 0))});
  if (!out.empty() || fresh.empty()) return out;
  // Everyone waits in a call: those that finished fewer calls than the other ranks of
  // their pipeline stage (which make the same calls) are behind.
  std::map<int, std::pair<double, double>> range;  // stage -> (fewest, most) calls finished
  for (int r : fresh) {
    const int st = int(num(hbs[r], "stage", 0));
    const double n = num(hbs[r], "ops_done", 0);
    auto it = range.find(st);
    if (it == range.end()) range[st] = {n, n};
    else it->second = {std::min(it->second.first, n), std::max(it->second.second, n)};
  }
  for (int r : fresh) {
    const auto [lo, hi] = range[int(num(hbs[r], "stage", 0))];
    if (lo < hi && num(hbs[r], "ops_done", 0) == lo)
      out.push_back({r, host_of(hbs[r]),
                     absl::StrFormat("behind: %d communicator calls finished, others of its stage up to %d; waits "
                                     "in %s", int64_t(lo), int64_t(hi), hbs[r].value("op", "?"))});
  }
  return out;
}

Watchdog::Watchdog(const WatchdogConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  section_start_ = monotonic_seconds();
  progress_unix_ = unix_seconds();
  thread_ = std::thread([this] { loop(); });
}

void Watchdog::start_heartbeats() {
  if (cfg_.run_dir.empty()) return;
  std::error_code ec;
  fs::create_directories(cfg_.run_dir + "/heartbeats", ec);
  beating_ = true;
  write_heartbeat();
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  // An expiring watchdog ends the process itself; the main thread, unwinding from an
  // aborted call, must not wait for it but report its own error (and exit the same way).
  if (thread_.joinable()) expiring_ ? thread_.detach() : thread_.join();
}

void Watchdog::enter(Section s, int64_t step) {
  std::lock_guard<std::mutex> l(mu_);
  section_ = s, step_ = step;
  if (s == Section::Step && first_step_ < 0) first_step_ = step;
  section_start_ = monotonic_seconds();
  progress_unix_ = unix_seconds();
}

void Watchdog::step_done(double seconds) {
  if (cfg_.auto_factor <= 0) return;
  std::lock_guard<std::mutex> l(mu_);
  if (step_ == first_step_) return;  // first use of every kernel and plan: not a typical step
  step_times_.push_back(seconds);
  if (step_times_.size() > 200) step_times_.erase(step_times_.begin());  // the recent steps
  if (static_cast<int>(step_times_.size()) < cfg_.auto_warmup) return;
  std::vector<double> t = step_times_;
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  const double before = auto_step_s_;
  auto_step_s_ = std::max(cfg_.auto_floor_s, cfg_.auto_factor * t[t.size() / 2]);
  if (before == 0 && cfg_.rank == 0)
    LOG(INFO) << absl::StrFormat("watchdog: step timeout %.1f s from now on (%.0f x the median step %.3f s, "
                                 "floor %.0f s)", auto_step_s_, cfg_.auto_factor, t[t.size() / 2], cfg_.auto_floor_s);
}

double Watchdog::timeout(Section s) const {
  switch (s) {
    case Section::Setup: return cfg_.setup_s;
    case Section::Step: {
      std::lock_guard<std::mutex> l(mu_);
      if (step_ == first_step_) return cfg_.setup_s;
      return auto_step_s_ > 0 ? auto_step_s_ : cfg_.step_s;
    }
    case Section::Save: return cfg_.save_s;
    case Section::Load: return cfg_.load_s;
    case Section::Eval: return cfg_.eval_s;
    default: return 0;
  }
}

void Watchdog::add_abort_hook(std::function<void()> hook) {
  std::lock_guard<std::mutex> l(mu_);
  hooks_.push_back(std::move(hook));
}

void Watchdog::add_probe(std::function<std::string()> probe) {
  std::lock_guard<std::mutex> l(mu_);
  probes_.push_back(std::move(probe));
}

nlohmann::json Watchdog::heartbeat_record() const {
  const CommActivity::Snapshot c = CommActivity::process().snapshot();
  const double now = monotonic_seconds();
  std::lock_guard<std::mutex> l(mu_);
  return {{"rank", cfg_.rank},
          {"host", cfg_.host},
          {"stage", cfg_.stage},
          {"pid", static_cast<int64_t>(::getpid())},
          {"section", section_name(section_)},
          {"step", step_},
          {"section_for_s", now - section_start_},
          {"progress_unix", progress_unix_},
          {"updated_unix", unix_seconds()},
          {"in_op", c.in_op},
          {"op", CommActivity::describe(c.op)},
          {"op_for_s", c.in_op ? now - c.op.since : 0.0},
          {"ops_done", c.ops_done},
          {"wait_s", c.wait_s}};
}

void Watchdog::write_heartbeat() {
  if (cfg_.run_dir.empty() || !beating_) return;
  write_small_file(rank_file(cfg_.run_dir + "/heartbeats", cfg_.rank), heartbeat_record().dump() + "\n");
}

std::string Watchdog::report(double for_s, const std::string& failure) const {
  const CommActivity::Snapshot c = CommActivity::process().snapshot();
  Section s;
  int64_t step;
  {
    std::lock_guard<std::mutex> l(mu_);
    s = section_, step = step_;
  }
  std::string line =
      failure.empty()
          ? absl::StrFormat("watchdog: rank %d (host %s) made no progress in %s (step %d) for %.1f s (timeout %.1f s): ",
                            cfg_.rank, cfg_.host, section_name(s), step, for_s, timeout(s))
          : absl::StrFormat("watchdog: rank %d (host %s): %s, in %s (step %d) after %.1f s: ", cfg_.rank, cfg_.host,
                            failure, section_name(s), step, for_s);
  if (c.in_op)
    absl::StrAppend(&line, absl::StrFormat("waiting in %s for %.1f s", CommActivity::describe(c.op),
                                           monotonic_seconds() - c.op.since));
  else
    absl::StrAppend(&line, "computing (no communicator call in flight; last: ", CommActivity::describe(c.op), ")");
  if (cfg_.run_dir.empty() || !beating_)
    return line + "; no heartbeats of the other ranks (" +
           (cfg_.run_dir.empty() ? "no --out_dir" : "the run was not accepted yet") + ")";
  std::vector<nlohmann::json> hbs(cfg_.world);
  for (int r = 0; r < cfg_.world; ++r) {
    std::ifstream f(rank_file(cfg_.run_dir + "/heartbeats", r));
    if (!f) continue;
    std::stringstream ss;
    ss << f.rdbuf();
    hbs[r] = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
    if (hbs[r].is_discarded()) hbs[r] = nullptr;
  }
  hbs[cfg_.rank] = heartbeat_record();  // our own, current
  const std::vector<Culprit> culprits = find_culprits(hbs, unix_seconds(), cfg_.heartbeat_s);
  if (culprits.empty()) return line + "; no rank stands out from the heartbeats (a deadlock in the order of calls?)";
  absl::StrAppend(&line, "; stopped making progress:");
  for (size_t i = 0; i < culprits.size(); ++i)
    absl::StrAppend(&line, i ? ";" : "", " rank ", culprits[i].rank, " (host ", culprits[i].host, "): ",
                    culprits[i].why);
  return line;
}

void Watchdog::loop() {
  const double tick = std::min(0.25, cfg_.heartbeat_s / 2);
  double next_beat = monotonic_seconds() + cfg_.heartbeat_s;
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    cv_.wait_for(l, std::chrono::duration<double>(tick));
    if (stop_) break;
    const double now = monotonic_seconds();
    const Section s = section_;
    const double for_s = now - section_start_;
    l.unlock();
    const double limit = timeout(s);
    if (limit > 0 && for_s > limit) expire(s, for_s);
    std::vector<std::function<std::string()>> probes;
    {
      std::lock_guard<std::mutex> g(mu_);
      probes = probes_;
    }
    for (auto& p : probes)
      if (std::string e = p(); !e.empty()) expire(s, for_s, e);
    if (now >= next_beat) {
      write_heartbeat();
      next_beat = now + cfg_.heartbeat_s;
    }
    l.lock();
  }
}

void Watchdog::expire(Section s, double for_s, const std::string& failure) {
  expiring_ = true;
  const int status = failure.empty() ? kExitHang : kExitCommFault;
  const std::string line = report(for_s, failure);
  LOG(ERROR) << line << "; ending the job with exit status " << status;
  google::FlushLogFiles(google::GLOG_INFO);
  if (!cfg_.run_dir.empty() && beating_) {
    std::error_code ec;
    fs::create_directories(cfg_.run_dir + "/faults", ec);
    std::lock_guard<std::mutex> l(mu_);
    const nlohmann::json rec = {{"rank", cfg_.rank}, {"host", cfg_.host},
                                {"cause", failure.empty() ? "hang" : "communicator failure"},
                                {"exit_status", status}, {"section", section_name(s)},
                                {"step", step_}, {"for_s", for_s}, {"report", line},
                                {"unix", unix_seconds()}};
    write_small_file(rank_file(cfg_.run_dir + "/faults", cfg_.rank), rec.dump() + "\n");
  }
  std::vector<std::function<void()>> hooks;
  {
    std::lock_guard<std::mutex> l(mu_);
    hooks = hooks_;
  }
  for (auto& h : hooks) {
    try {
      h();
    } catch (...) {
    }
  }
  // An aborted NCCL call returns, and the main thread ends the job itself (FaultError);
  // a host thread stuck in MPI never returns: end it here.
  if (!hooks.empty()) std::this_thread::sleep_for(std::chrono::duration<double>(cfg_.grace_s));
  std::fflush(stdout), std::fflush(stderr);
  std::_Exit(status);
}

}  // namespace lns
