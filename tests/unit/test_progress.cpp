// Progress for people (lns/core/progress.h, the step line of lns/train/step_log.h): durations, the
// ETA from the recent steps, and a bar on a terminal against plain lines in a pipe.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "lns/core/progress.h"
#include "lns/train/step_log.h"
#include "lns/train/trainer.h"

namespace lns {
namespace {

TEST(Progress, DurationsReadAsPeopleWriteThem) {
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(0.4), "0s");
  EXPECT_EQ(format_duration(12.3), "12s");
  EXPECT_EQ(format_duration(59.6), "1m00s");  // rounded to whole seconds first
  EXPECT_EQ(format_duration(83), "1m23s");
  EXPECT_EQ(format_duration(3599), "59m59s");
  EXPECT_EQ(format_duration(3600), "1h00m");
  EXPECT_EQ(format_duration(7530), "2h05m");
  EXPECT_EQ(format_duration(86399), "23h59m");
  EXPECT_EQ(format_duration(3 * 86400 + 4 * 3600 + 59), "3d04h");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(NAN), "?");
  EXPECT_EQ(eta_text(10.0, 0, 100), "?");
  EXPECT_EQ(eta_text(10.0, 25, 100), "30s");    // 75 left at 0.4 s each
  EXPECT_EQ(eta_text(60.0, 1, 100), "1h39m");  // 99 left at 60 s each
}

StepStats step(int64_t i, double seconds) {
  StepStats s;
  s.step = i, s.loss = 2.5, s.lr = 1e-3, s.grad_norm = 0.5, s.seconds = seconds;
  return s;
}

// The mean of the last 20 steps without the first (start-up), times the steps left;
// the line says it after the elapsed time and the record carries eta_s.
TEST(Progress, StepLineCarriesElapsedAndEta) {
  StepLog log({100, 10, 1000, 0, 0, 1}, 1000.0);
  log.add(step(1, 30.0));  // the first step pays one-time costs
  EXPECT_DOUBLE_EQ(log.eta_seconds(1), 99 * 30.0);  // nothing better known yet
  std::string line = log.line(step(1, 30.0), 1030.0, "");
  EXPECT_NE(line.find("| 30.0 s elapsed, ETA 49m30s"), std::string::npos) << line;
  for (int i = 2; i <= 10; ++i) log.add(step(i, i % 2 ? 1.0 : 2.0));  // steps 2..10: mean 1.5 s (5 x 2 s, 4 x 1 s)
  EXPECT_NEAR(log.eta_seconds(10), 90 * (5 * 2.0 + 4 * 1.0) / 9, 1e-9);
  line = log.line(step(10, 1.0), 1043.5, "");
  EXPECT_NE(line.find("| 43.5 s elapsed, ETA 2m20s"), std::string::npos) << line;  // 90 x 14/9 = 140 s
  for (int i = 11; i <= 40; ++i) log.add(step(i, 0.5));  // the window keeps the last 20 only
  EXPECT_DOUBLE_EQ(log.eta_seconds(40), 60 * 0.5);
  const nlohmann::json r = log.record(step(40, 0.5), 1060.0, nullptr, {});
  EXPECT_DOUBLE_EQ(r["eta_s"].get<double>(), 30.0);
  EXPECT_DOUBLE_EQ(r["elapsed_s"].get<double>(), 60.0);
  log.add(step(100, 0.5));
  EXPECT_NE(log.line(step(100, 0.5), 1100.0, "").find("ETA 0s"), std::string::npos);
}

std::string drain(FILE* f, char* buf) {
  std::fflush(f);
  return std::string(buf);
}

// Into a pipe or file (not a terminal) the bar is plain lines, one per tenth and the
// last, without carriage returns; the Bar mode redraws one line with them.
TEST(Progress, PipedOutputIsPlainLinesAndTerminalsGetOneRedrawnLine) {
  char* buf = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&buf, &size);
  ASSERT_NE(f, nullptr);
  {
    ProgressBar bar("job", 40, f);  // Auto: a memory stream is no terminal
    EXPECT_EQ(bar.mode(), ProgressBar::Mode::Lines);
    for (int i = 1; i <= 40; ++i) bar.update(i, "item" + std::to_string(i));
    bar.update(40);  // the end again: said once
  }
  std::string out = drain(f, buf);
  EXPECT_EQ(out.find('\r'), std::string::npos) << out;
  int lines = 0;
  for (char c : out) lines += c == '\n';
  EXPECT_EQ(lines, 10) << out;  // 4, 8, ..., 40
  EXPECT_EQ(out.rfind("job: 4/40 (10%) item4 | ", 0), 0u) << out;
  EXPECT_NE(out.find("job: 40/40 (100%) item40 | "), std::string::npos) << out;
  std::fclose(f);
  std::free(buf);

  buf = nullptr;
  f = open_memstream(&buf, &size);
  {
    ProgressBar bar("job", 3, f, ProgressBar::Mode::Bar);
    for (int i = 1; i <= 3; ++i) bar.update(i);
  }
  out = drain(f, buf);
  EXPECT_EQ(out.front(), '\r') << out;
  EXPECT_NE(out.find("[########################] job: 3/3 (100%)"), std::string::npos) << out;
  EXPECT_EQ(out.back(), '\n') << "the finished bar ends its line";
  std::fclose(f);
  std::free(buf);
}

}  // namespace
}  // namespace lns
