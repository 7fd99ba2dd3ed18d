#include "cuda/op_profile.h"

#include <cuda_runtime.h>

#include "cuda/runtime.h"

namespace lns::cuda {

bool g_profile_on = false;

namespace {

// Events are made once and reused by every later profile: [2k] begins op k, [2k+1]
// ends it.
std::vector<cudaEvent_t> g_events;
std::vector<const char*> g_files;  // op k's dispatching file
size_t g_ops = 0;
int g_depth = 0;  // nested dispatches belong to the outermost op
bool g_in_segment = false;        // a ProfileSegment's interval is running
const char* g_op_file = nullptr;  // the running outermost op's file (the one a segment interrupts)

cudaEvent_t event_at(size_t i) {
  while (g_events.size() <= i) {
    cudaEvent_t e;
    LNS_CUDA_CHECK(cudaEventCreate(&e));
    g_events.push_back(e);
  }
  return g_events[i];
}

}  // namespace

void profile_start() {
  synchronize();
  g_ops = 0, g_depth = 0, g_in_segment = false;
  g_files.clear();
  g_profile_on = true;
}

void profile_op_begin(const char* file) {
  if (g_depth++ > 0) return;
  LNS_CUDA_CHECK(cudaEventRecord(event_at(2 * g_ops), stream()));
  g_files.push_back(file);
  if (!g_in_segment) g_op_file = file;
}

void profile_op_end() {
  if (--g_depth > 0) return;
  LNS_CUDA_CHECK(cudaEventRecord(event_at(2 * g_ops + 1), stream()));
  ++g_ops;
}

// A segment ends the op's running interval and starts its own; its end starts the op's
// again, under the op's file.
bool profile_segment_begin(const char* file) {
  if (g_depth != 1 || g_in_segment) return false;
  profile_op_end();  // the op's interval so far (depth 1 -> 0)
  g_in_segment = true;
  profile_op_begin(file);
  return true;
}

void profile_segment_end() {
  g_in_segment = false;
  profile_op_end();
  profile_op_begin(g_op_file);  // the rest of the op
}

std::vector<OpTiming> profile_stop() {
  g_profile_on = false;
  synchronize();
  std::vector<OpTiming> out;
  out.reserve(g_ops);
  for (size_t k = 0; k < g_ops; ++k) {
    float ms = 0;
    LNS_CUDA_CHECK(cudaEventElapsedTime(&ms, g_events[2 * k], g_events[2 * k + 1]));
    out.push_back({g_files[k], ms});
  }
  return out;
}

}  // namespace lns::cuda
