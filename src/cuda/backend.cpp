// The CUDA backend's device (lns/core/backend.h): memory, the compute stream of
// cuda/runtime.h, graphs, the op profile's events and cuDNN's library, registered with
// core at start-up. The ops register in their own files (lns/core/op_table.h).
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <cuda_runtime.h>

#include "cuda/op_profile.h"
#include "cuda/pool.h"
#include "cuda/runtime.h"
#include "cuda/sdpa.h"
#include "lns/core/backend.h"
#include "lns/core/errors.h"

namespace lns::cuda {
namespace {

class CudaBackend final : public DeviceBackend {
 public:
  int device_count() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no driver" error
      return 0;
    }
    return n;
  }
  std::string unavailable_reason() override {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return absl::StrCat("no usable CUDA device (", cudaGetErrorString(e), ")");
    }
    return n == 0 ? "no CUDA device visible" : "";
  }
  void set_device(int ordinal) override { LNS_CUDA_CHECK(cudaSetDevice(ordinal)); }
  std::string describe() override {
    int dev = 0, driver = 0;
    cudaDeviceProp p{};
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) return "no GPU";
    cudaDriverGetVersion(&driver);
    return absl::StrFormat("%s (GPU %d), CUDA driver %d.%d, %d SMs, %.1f GiB", p.name, dev, driver / 1000,
                           (driver % 1000) / 10, p.multiProcessorCount, p.totalGlobalMem / double(1 << 30));
  }
  bool memory_info(size_t* free_bytes, size_t* total_bytes) override {
    return cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess;
  }

  void* alloc(size_t nbytes) override {
    void* p = nullptr;
    if (cudaMalloc(&p, nbytes) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    LNS_CHECK(cudaMemset(p, 0, nbytes) == cudaSuccess);
    return p;
  }
  void free(void* p) override { cudaFree(p); }
  void copy(void* dst, const void* src, size_t nbytes) override {
    LNS_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, cuda::stream()));
  }
  void zero(void* p, size_t nbytes) override { LNS_CUDA_CHECK(cudaMemsetAsync(p, 0, nbytes, cuda::stream())); }
  void guard_padding(void* p, size_t nbytes) override { pool_padding(p, nbytes, cuda::stream()); }

  void* stream() override { return cuda::stream(); }
  void synchronize() override { cuda::synchronize(); }
  void add_sync_watch(void (*watch)(void* ctx), void* ctx) override { cuda::add_sync_watch(watch, ctx); }
  void remove_sync_watch(void* ctx) override { cuda::remove_sync_watch(ctx); }

  void* graph_record(const std::function<void()>& work) override {
    // Thread-local: only this thread's calls may not be made during the capture.
    LNS_CUDA_CHECK(cudaStreamBeginCapture(cuda::stream(), cudaStreamCaptureModeThreadLocal));
    cudaGraph_t graph = nullptr;
    try {
      work();
    } catch (...) {
      cudaStreamEndCapture(cuda::stream(), &graph);  // leave the stream usable
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    LNS_CUDA_CHECK(cudaStreamEndCapture(cuda::stream(), &graph));
    cudaGraphExec_t exec = nullptr;
    LNS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    LNS_CUDA_CHECK(cudaGraphDestroy(graph));
    return exec;
  }
  void graph_launch(void* graph) override {
    LNS_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), cuda::stream()));
  }
  void graph_destroy(void* graph) override { cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph)); }

  void profile_start() override { cuda::profile_start(); }
  std::vector<OpTiming> profile_stop() override { return cuda::profile_stop(); }
  void profile_op_begin(const char* file) override { cuda::profile_op_begin(file); }
  void profile_op_end() override { cuda::profile_op_end(); }

  std::string attention_library(const std::string& what) override { return sdpa_library(what); }
};

CudaBackend g_backend;
[[maybe_unused]] const bool g_registered = (register_device_backend(Device::CUDA, &g_backend), true);

}  // namespace
}  // namespace lns::cuda
