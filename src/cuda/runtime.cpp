#include "cuda/runtime.h"

#include <array>

#include "cuda/pool.h"
#include "lns/errors.h"

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

void synchronize() { LNS_CUDA_CHECK(cudaStreamSynchronize(stream())); }

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
