#include "cuda/runtime.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <thread>
#include <vector>

#include "cuda/pool.h"
#include "lns/core/errors.h"

namespace lns::cuda {

void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return;
  LOG(FATAL) << "CUDA error " << cudaGetErrorName(e) << " (" << cudaGetErrorString(e) << ") in "
             << what << " at " << file << ":" << line;
}

cudaStream_t stream() {
  // A blocking stream: it also orders against the legacy default stream that
  // cudaMemset/cudaMemcpy without a stream use (Buffer allocation, MPI staging).
  static cudaStream_t s = [] {
    cudaStream_t st;
    LNS_CUDA_CHECK(cudaStreamCreate(&st));
    return st;
  }();
  return s;
}

namespace {
std::vector<std::pair<void (*)(void*), void*>>& watches() {
  static std::vector<std::pair<void (*)(void*), void*>> w;
  return w;
}
}  // namespace

void add_sync_watch(void (*watch)(void* ctx), void* ctx) { watches().emplace_back(watch, ctx); }
void remove_sync_watch(void* ctx) {
  auto& w = watches();
  w.erase(std::remove_if(w.begin(), w.end(), [&](const auto& e) { return e.second == ctx; }), w.end());
}

void synchronize() {
  if (watches().empty()) {
    LNS_CUDA_CHECK(cudaStreamSynchronize(stream()));
    return;
  }
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream());
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) LNS_CUDA_CHECK(e);
    for (const auto& [watch, ctx] : std::vector(watches())) watch(ctx);
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void* scratch(Scratch which, size_t bytes) {
  struct Slot {
    void* ptr = nullptr;
    size_t size = 0;
  };
  static std::array<Slot, static_cast<size_t>(Scratch::kCount)> slots;
  Slot& s = slots[static_cast<size_t>(which)];
  if (bytes > s.size) {
    synchronize();  // the old buffer may still be read by queued kernels
    if (s.ptr) LNS_CUDA_CHECK(cudaFree(s.ptr));
    s.size = (bytes + 255) / 256 * 256;
    LNS_CUDA_CHECK(cudaMalloc(&s.ptr, s.size));
  }
  pool_use(s.ptr, bytes, stream());  // this user's bytes; the rest is out of bounds
  pool_gap(static_cast<char*>(s.ptr) + bytes, s.size - bytes, stream());
  return s.ptr;
}

int sm_count() {
  static const int n = [] {
    int dev = 0, count = 0;
    LNS_CUDA_CHECK(cudaGetDevice(&dev));
    LNS_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev));
    return count;
  }();
  return n;
}

}  // namespace lns::cuda
