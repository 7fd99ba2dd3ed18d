#include "lns/device.h"

#include <cstdlib>
#include <cstring>

#include <absl/strings/str_format.h>

#include "lns/bf16.h"
#include "lns/errors.h"

#ifdef LNS_WITH_CUDA
#include "cuda/pool.h"
#include "cuda/runtime.h"
#endif

namespace lns {

Device parse_device(const std::string& value) {
  if (value == "cpu") return Device::CPU;
  if (value == "cuda") return Device::CUDA;
  fail("--device must be cpu or cuda, got '", value, "'");
}

const char* device_name(Device d) { return d == Device::CUDA ? "cuda" : "cpu"; }

bool cuda_built() {
#ifdef LNS_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef LNS_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

std::string cuda_unavailable_reason() {
#ifdef LNS_WITH_CUDA
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return absl::StrCat("no usable CUDA device (", cudaGetErrorString(e), ")");
  }
  return n == 0 ? "no CUDA device visible" : "";
#else
  return "this build has no CUDA support (configure with -DLNS_CUDA=ON)";
#endif
}

int local_rank_from_env() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"}) {
    const char* v = std::getenv(var);
    if (v && *v) {
      char* end = nullptr;
      const long r = std::strtol(v, &end, 10);
      LNS_REQUIRE(*end == '\0' && r >= 0, "environment variable ", var, " must be a local rank, got '", v, "'");
      return static_cast<int>(r);
    }
  }
  return 0;
}

int bind_local_gpu(int local_rank) {
  const int n = cuda_device_count();
  LNS_REQUIRE(n > 0, "--device=cuda: ", cuda_unavailable_reason());
#ifdef LNS_WITH_CUDA
  const int dev = local_rank % n;
  LNS_CUDA_CHECK(cudaSetDevice(dev));
  return dev;
#else
  return -1;
#endif
}

std::string current_gpu_description() {
#ifdef LNS_WITH_CUDA
  int dev = 0, driver = 0;
  cudaDeviceProp p{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) return "no GPU";
  cudaDriverGetVersion(&driver);
  return absl::StrFormat("%s (GPU %d), CUDA driver %d.%d, %d SMs, %.1f GiB", p.name, dev,
                         driver / 1000, (driver % 1000) / 10, p.multiProcessorCount,
                         p.totalGlobalMem / double(1 << 30));
#else
  return "no GPU (built without CUDA)";
#endif
}

void copy_tensor(Tensor dst, Tensor src) {
  LNS_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel())
      << dtype_name(dst.dtype) << dst.shape.str() << " <- " << dtype_name(src.dtype) << src.shape.str();
  if (dst.data == src.data || src.nbytes() == 0) return;
  if (dst.device == Device::CPU && src.device == Device::CPU) {
    std::memcpy(dst.data, src.data, src.nbytes());
    return;
  }
#ifdef LNS_WITH_CUDA
  LNS_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDefault, cuda::stream()));
  if (dst.device == Device::CPU || src.device == Device::CPU) cuda::synchronize();
#else
  LNS_CHECK(false) << "a CUDA tensor reached a build without CUDA support";
#endif
}

void guard_device_padding(Tensor padding) {
  if (padding.device != Device::CUDA || padding.nbytes() == 0) return;
#ifdef LNS_WITH_CUDA
  cuda::pool_padding(padding.data, padding.nbytes(), cuda::stream());
#endif
}

void zero_tensor(Tensor t) {
  if (t.nbytes() == 0) return;
  if (t.device == Device::CPU) {
    std::memset(t.data, 0, t.nbytes());
    return;
  }
#ifdef LNS_WITH_CUDA
  LNS_CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.nbytes(), cuda::stream()));
#endif
}

std::vector<float> to_host_f32(Tensor src) {
  std::vector<float> out(src.numel());
  if (src.dtype == DType::F32) {
    copy_tensor(Tensor{out.data(), DType::F32, Device::CPU, src.shape}, src);
    return out;
  }
  LNS_CHECK(src.dtype == DType::BF16) << "to_host_f32 of " << dtype_name(src.dtype);
  std::vector<uint16_t> raw(src.numel());
  copy_tensor(Tensor{raw.data(), DType::BF16, Device::CPU, src.shape}, src);
  for (size_t i = 0; i < raw.size(); ++i) out[i] = bf16_to_f32(raw[i]);
  return out;
}

size_t cuda_memory_in_use() {
#ifdef LNS_WITH_CUDA
  size_t free_b = 0, total_b = 0;
  if (cuda_device_count() == 0 || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 0;
  return total_b - free_b;
#else
  return 0;
#endif
}

void device_synchronize(Device d) {
#ifdef LNS_WITH_CUDA
  if (d == Device::CUDA) cuda::synchronize();
#endif
}

void DeviceGraph::record(const std::function<void()>& work) {
#ifdef LNS_WITH_CUDA
  reset();
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
  exec_ = exec;
#else
  (void)work;
  LNS_CHECK(false) << "DeviceGraph needs a CUDA build";
#endif
}

void DeviceGraph::launch() const {
  LNS_CHECK(exec_) << "DeviceGraph::launch before record";
#ifdef LNS_WITH_CUDA
  LNS_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), cuda::stream()));
#endif
}

void DeviceGraph::reset() {
#ifdef LNS_WITH_CUDA
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
#endif
  exec_ = nullptr;
}

}  // namespace lns
