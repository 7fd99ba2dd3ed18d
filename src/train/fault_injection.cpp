#include "lns/train/fault_injection.h"

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "lns/core/errors.h"

namespace fs = std::filesystem;

namespace lns {

std::vector<InjectedFault> parse_fault_spec(const std::string& spec) {
  std::vector<InjectedFault> out;
  if (spec.empty()) return out;
  auto bad = [&](const std::string& part, const std::string& why) {
    fail("--inject_fault: '", part, "': ", why,
         " (expected KIND@STEP[:rank=R][:factor=F], KIND one of hang, stop, exit, slow, bitflip, nan, spike, "
         "hang_save)");
  };
  for (const absl::string_view sv : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    const std::string part(sv);
    std::vector<std::string> fields = absl::StrSplit(part, ':');
    std::vector<std::string> head = absl::StrSplit(fields[0], '@');
    if (head.size() != 2) bad(part, "no @STEP");
    InjectedFault f;
    f.text = part;
    const std::string& k = head[0];
    using K = InjectedFault::Kind;
    if (k == "hang") f.kind = K::Hang;
    else if (k == "stop") f.kind = K::Stop;
    else if (k == "exit") f.kind = K::Exit;
    else if (k == "slow") f.kind = K::Slow;
    else if (k == "bitflip") f.kind = K::BitFlip;
    else if (k == "nan") f.kind = K::Nan;
    else if (k == "spike") f.kind = K::Spike;
    else if (k == "hang_save") f.kind = K::HangSave;
    else bad(part, "unknown kind '" + k + "'");
    if (!absl::SimpleAtoi(head[1], &f.step) || f.step < 1 || f.step > (int64_t{1} << 40))
      bad(part, "STEP must be a step number >= 1");
    for (size_t i = 1; i < fields.size(); ++i) {
      std::vector<std::string> kv = absl::StrSplit(fields[i], absl::MaxSplits('=', 1));
      if (kv.size() != 2) bad(part, "'" + fields[i] + "' is not NAME=VALUE");
      if (kv[0] == "rank") {
        if (!absl::SimpleAtoi(kv[1], &f.rank) || f.rank < 0) bad(part, "rank must be a rank number >= 0");
      } else if (kv[0] == "factor" && f.kind == K::Slow) {
        if (!absl::SimpleAtod(kv[1], &f.factor) || !std::isfinite(f.factor) || f.factor < 1 || f.factor > 1000)
          bad(part, "factor must be a number between 1 and 1000");
      } else {
        bad(part, "unknown option '" + kv[0] + "'");
      }
    }
    out.push_back(f);
  }
  return out;
}

FaultInjector::FaultInjector(const std::string& spec, int rank, const std::string& run_dir)
    : faults_(parse_fault_spec(spec)), fired_(faults_.size(), false), rank_(rank), run_dir_(run_dir) {}

bool FaultInjector::fire(InjectedFault& f) {
  if (run_dir_.empty()) return true;
  const fs::path dir = fs::path(run_dir_) / "faults";
  std::string name = "injected_" + f.text;
  for (char& c : name)
    if (c == '/' || c == ':' || c == '=' || c == '@') c = '_';
  const fs::path marker = dir / (name + ".rank" + std::to_string(rank_));
  std::error_code ec;
  if (fs::exists(marker, ec)) return false;
  fs::create_directories(dir, ec);
  std::ofstream(marker) << f.text << "\n";
  return true;
}

double FaultInjector::at_step_start(int64_t step, double last_compute_s) {
  double extra = 0;
  for (size_t i = 0; i < faults_.size(); ++i) {
    InjectedFault& f = faults_[i];
    if (f.rank != rank_) continue;
    using K = InjectedFault::Kind;
    if (f.kind == K::Slow && step >= f.step) {
      if (!fired_[i]) {
        fired_[i] = true;
        LOG(WARNING) << "inject_fault: rank " << rank_ << " computes " << f.factor << "x slower from step " << step;
      }
      extra += (f.factor - 1) * std::max(last_compute_s, 0.01);
      continue;
    }
    if (step != f.step || fired_[i] || (f.kind != K::Hang && f.kind != K::Stop && f.kind != K::Exit)) continue;
    fired_[i] = true;
    if (!fire(f)) continue;
    LOG(WARNING) << "inject_fault: " << f.text << " on rank " << rank_ << " at step " << step;
    google::FlushLogFiles(google::GLOG_INFO);
    if (f.kind == K::Exit) std::raise(SIGKILL);
    if (f.kind == K::Stop) std::raise(SIGSTOP);
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(3600));  // Hang: computing forever
  }
  return extra;
}

void FaultInjector::in_save(int64_t step) {
  for (size_t i = 0; i < faults_.size(); ++i) {
    InjectedFault& f = faults_[i];
    if (f.kind != InjectedFault::Kind::HangSave || f.rank != rank_ || f.step != step || fired_[i]) continue;
    fired_[i] = true;
    if (!fire(f)) continue;
    LOG(WARNING) << "inject_fault: " << f.text << " on rank " << rank_ << " in the save of step " << step;
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(3600));
  }
}

bool FaultInjector::take_bitflip(int64_t step) {
  for (size_t i = 0; i < faults_.size(); ++i) {
    InjectedFault& f = faults_[i];
    if (f.kind != InjectedFault::Kind::BitFlip || f.rank != rank_ || f.step != step || fired_[i]) continue;
    fired_[i] = true;
    if (!fire(f)) continue;
    LOG(WARNING) << "inject_fault: " << f.text << ": flipping a bit of rank " << rank_ << "'s gradients";
    return true;
  }
  return false;
}

double FaultInjector::loss_factor(uint64_t first_sample, int64_t global_batch) const {
  double factor = 1;
  for (const InjectedFault& f : faults_) {
    if (f.kind != InjectedFault::Kind::Nan && f.kind != InjectedFault::Kind::Spike) continue;
    if (first_sample != uint64_t(f.step - 1) * uint64_t(global_batch)) continue;
    factor *= f.kind == InjectedFault::Kind::Nan ? std::numeric_limits<double>::quiet_NaN() : 20.0;
  }
  return factor;
}

}  // namespace lns
