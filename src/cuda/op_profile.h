// The CUDA side of lns/op_profile.h: events around each dispatched op. OpScope is
// what LNS_DISPATCH (src/core/dispatch.h) puts around every call into lns::cuda; off,
// it costs one load and a branch.
#pragma once
#include <vector>

namespace lns::cuda {

extern bool g_profile_on;

struct OpTiming {
  const char* file;  // __FILE__ of the dispatch (its class: lns::op_class_of_file)
  double ms;
};

void profile_start();
std::vector<OpTiming> profile_stop();  // synchronizes the stream

void profile_op_begin(const char* file);
void profile_op_end();

class OpScope {
 public:
  explicit OpScope(const char* file) : on_(g_profile_on) {
    if (on_) profile_op_begin(file);
  }
  ~OpScope() {
    if (on_) profile_op_end();
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  bool on_;
};

// A part of the current op timed as a class of its own (`file`, a name op_class_of_file
// maps), e.g. the FP8 casts inside an FP8 linear: the op's time is cut at the segment's
// ends, so the rows still add up to the step. Only directly inside one op (nested ops
// belong to the outermost); elsewhere, and with the profile off, it does nothing.
bool profile_segment_begin(const char* file);  // false: not directly inside one op (nothing done)
void profile_segment_end();                      // only after a begin that returned true

class ProfileSegment {
 public:
  explicit ProfileSegment(const char* file) : on_(g_profile_on && profile_segment_begin(file)) {}
  ~ProfileSegment() {
    if (on_) profile_segment_end();
  }
  ProfileSegment(const ProfileSegment&) = delete;
  ProfileSegment& operator=(const ProfileSegment&) = delete;

 private:
  bool on_;
};

}  // namespace lns::cuda
