// Progress of long jobs, for people watching them: durations as "1m23s", and a bar that
// redraws one line on a terminal and prints plain lines when its stream is a pipe or a
// file (a log should read line by line; a terminal should not scroll). lns_convert and
// lns_eval's layer sweep use it; the trainer's step line uses format_duration for its ETA
// (lns/train/step_log.h); tools/prepare_data.py follows the same rules in Python.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

namespace lns {

// A duration for people, two units at most: "0s", "42s", "1m23s", "2h05m", "3d04h".
// Rounded to whole seconds; negative or non-finite: "?".
std::string format_duration(double seconds);

// The time left from the mean time per unit so far: (total - done) * elapsed / done, "?"
// before the first unit.
std::string eta_text(double elapsed, int64_t done, int64_t total);

class ProgressBar {
 public:
  enum class Mode { Auto, Bar, Lines, Off };
  // `what` names the job ("export-hf"); out is where it goes (stderr by default). Auto:
  // Bar when out is a terminal (isatty), Lines otherwise.
  ProgressBar(std::string what, int64_t total, FILE* out = stderr, Mode mode = Mode::Auto);
  ~ProgressBar();  // finishes the bar's line
  // `done` of total units are complete; `item` names the last (a tensor, a layer).
  // Bar: the line is redrawn (at most every 0.1 s, and at the end). Lines: one line
  // when a new tenth of the total is reached, and at the end:
  //   "<what>: 3/10 (30%) <item> | 1.2 s elapsed, ETA 2s"
  void update(int64_t done, const std::string& item = "");
  void set_total(int64_t total) { total_ = total > 0 ? total : 1; }  // when known only later
  Mode mode() const { return mode_; }

 private:
  std::string line(int64_t done, const std::string& item, double elapsed) const;
  std::string what_;
  int64_t total_;
  FILE* out_;
  Mode mode_;
  double start_, last_draw_ = -1;
  int64_t last_tenth_ = 0;
  bool drawn_ = false;
};

}  // namespace lns
