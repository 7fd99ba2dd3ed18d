// A test-only implementation of src/cuda/sim/sim_api.h so that the cuBLASLt and NCCL
// stand-ins are tested in the plain CPU build, without the SIMT runtime: device memory
// is a registry of 256-byte aligned host allocations, queued operations run in
// enqueue order at synchronize(), fail() prints its line and aborts (death tests).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <vector>

#include "cuda/sim/sim_api.h"
#include "tests/sim/device_mem.h"

namespace {

std::map<const char*, size_t> g_allocations;  // base -> bytes
std::vector<std::function<void()>> g_queue;
int g_device = 0;

}  // namespace

namespace lns::sim {

void fail(const std::string& message) {
  std::fprintf(stderr, "lns-sim: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

void require_device_range(const void* p, std::size_t bytes, const char* what) {
  const char* c = static_cast<const char*>(p);
  auto it = g_allocations.upper_bound(c);
  if (it != g_allocations.begin()) {
    --it;
    if (c >= it->first && bytes <= it->second && size_t(c - it->first) <= it->second - bytes) return;
  }
  char b[64];
  std::snprintf(b, sizeof b, "%p+%zu", p, bytes);
  fail(std::string(what) + ": " + b + " is not inside one live device allocation");
}

void enqueue(cudaStream_t, const char*, std::function<void()> op, const void*) { g_queue.push_back(std::move(op)); }

// The stand-ins declare what their queued work touches: it must be device memory.
void declare_access(const void* p, std::size_t bytes, bool) {
  if (bytes) require_device_range(p, bytes, "declared access");
}

int current_device() { return g_device; }

void warp_collective(unsigned, void*, void (*)(void* const[32], void*), void*, const char* what) {
  fail(std::string(what) + ": no warps in the stand-in test stub");
}

}  // namespace lns::sim

namespace lns::simtest {

void* device_alloc(size_t bytes) {
  char* p = static_cast<char*>(std::aligned_alloc(256, (bytes + 255) / 256 * 256));
  g_allocations[p] = bytes;
  return p;
}
void device_free(void* p) {
  g_allocations.erase(static_cast<char*>(p));
  std::free(p);
}
void upload(void* dst, const void* src, size_t bytes) {
  sim::require_device_range(dst, bytes, "upload");
  std::memcpy(dst, src, bytes);
}
void download(void* dst, const void* src, size_t bytes) {
  sim::require_device_range(src, bytes, "download");
  std::memcpy(dst, src, bytes);
}
void synchronize() {
  for (size_t i = 0; i < g_queue.size(); ++i) g_queue[i]();  // an op may queue more
  g_queue.clear();
}
void set_device(int device) { g_device = device; }
bool deferred_until_sync() { return true; }

}  // namespace lns::simtest
