// tests/sim/device_mem.h over the CUDA runtime: in the emulation build
// (-DLNS_CUDA_SIM=ON) this is the real emulator, so the stand-in tests run on it.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "tests/sim/device_mem.h"

namespace lns::simtest {
namespace {
void ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  std::abort();
}
}  // namespace

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  ok(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}
void device_free(void* p) { ok(cudaFree(p), "cudaFree"); }
void upload(void* dst, const void* src, size_t bytes) { ok(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "upload"); }
void download(void* dst, const void* src, size_t bytes) {
  ok(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "download");
}
void synchronize() { ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
void set_device(int device) { ok(cudaSetDevice(device), "cudaSetDevice"); }
bool deferred_until_sync() { return false; }  // the runtime may run work at any legal point

}  // namespace lns::simtest
