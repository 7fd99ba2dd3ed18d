// The CUDA side of lns/core/op_profile.h: events around each op dispatched to CUDA (the
// backend's profile hooks, lns/core/backend.h, src/cuda/backend.cpp).
#pragma once
#include <vector>

#include "lns/core/backend.h"

namespace lns::cuda {

extern bool g_profile_on;

void profile_start();
std::vector<OpTiming> profile_stop();  // synchronizes the stream

// Around each op dispatched to CUDA while the profile runs (lns/core/op_table.h's OpCall,
// through the backend's profile hooks): events on the compute stream.
void profile_op_begin(const char* file);
void profile_op_end();

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
