#include "lns/core/progress.h"

#include <unistd.h>

#include <chrono>
#include <cmath>

#include <absl/strings/str_format.h>

namespace lns {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = std::llround(seconds);
  if (s < 60) return absl::StrFormat("%ds", s);
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, s % 86400 / 3600);
}

std::string eta_text(double elapsed, int64_t done, int64_t total) {
  if (done <= 0) return "?";
  return format_duration(double(total - done) * elapsed / double(done));
}

ProgressBar::ProgressBar(std::string what, int64_t total, FILE* out, Mode mode)
    : what_(std::move(what)), total_(total > 0 ? total : 1), out_(out), mode_(mode), start_(now()) {
  if (mode_ == Mode::Auto) mode_ = out_ && ::isatty(::fileno(out_)) ? Mode::Bar : Mode::Lines;
}

ProgressBar::~ProgressBar() {
  if (mode_ == Mode::Bar && drawn_) {
    std::fputc('\n', out_);
    std::fflush(out_);
  }
}

std::string ProgressBar::line(int64_t done, const std::string& item, double elapsed) const {
  return absl::StrFormat("%s: %d/%d (%d%%)%s | %.1f s elapsed, ETA %s", what_, done, total_, 100 * done / total_,
                         item.empty() ? "" : " " + item, elapsed, eta_text(elapsed, done, total_));
}

void ProgressBar::update(int64_t done, const std::string& item) {
  if (mode_ == Mode::Off || !out_) return;
  const double t = now(), elapsed = t - start_;
  if (mode_ == Mode::Bar) {
    if (done < total_ && last_draw_ >= 0 && t - last_draw_ < 0.1) return;
    last_draw_ = t;
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(kWidth * done / total_);
    // \r and "erase to the end of the line": a shorter line leaves nothing behind
    absl::FPrintF(out_, "\r[%s%s] %s\033[K", std::string(filled, '#'), std::string(kWidth - filled, '.'),
                  line(done, item, elapsed));
    std::fflush(out_);
    drawn_ = true;
    return;
  }
  const int64_t tenth = 10 * done / total_;
  if (tenth <= last_tenth_ && done < total_) return;
  if (done >= total_ && last_tenth_ > 10) return;  // the end, said once
  last_tenth_ = done >= total_ ? 11 : tenth;
  absl::FPrintF(out_, "%s\n", line(done, item, elapsed));
  std::fflush(out_);
}

}  // namespace lns
