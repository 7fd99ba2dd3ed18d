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

}  // namespace lns::cuda
