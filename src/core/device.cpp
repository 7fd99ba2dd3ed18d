#include "lns/core/device.h"

#include <cstdlib>
#include <cstring>

#include <absl/strings/str_format.h>

#include "lns/core/backend.h"
#include "lns/core/bf16.h"
#include "lns/core/errors.h"

namespace lns {

namespace {
DeviceBackend* g_backends[2] = {nullptr, nullptr};  // by Device; the CPU's stays empty
DeviceBackend* cuda_backend() { return g_backends[static_cast<int>(Device::CUDA)]; }
}  // namespace

void register_device_backend(Device device, DeviceBackend* backend) {
  LNS_CHECK(device != Device::CPU && !g_backends[static_cast<int>(device)])
      << "a second backend for " << device_name(device);
  g_backends[static_cast<int>(device)] = backend;
}

DeviceBackend* device_backend(Device device) { return g_backends[static_cast<int>(device)]; }

Device parse_device(const std::string& value) {
  if (value == "cpu") return Device::CPU;
  if (value == "cuda") return Device::CUDA;
  fail("--device must be cpu or cuda, got '", value, "'");
}

const char* device_name(Device d) { return d == Device::CUDA ? "cuda" : "cpu"; }

bool cuda_built() { return cuda_backend() != nullptr; }

int cuda_device_count() { return cuda_backend() ? cuda_backend()->device_count() : 0; }

std::string cuda_unavailable_reason() {
  if (!cuda_backend()) return "this build has no CUDA support (configure with -DLNS_CUDA=ON)";
  return cuda_backend()->unavailable_reason();
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
  const int dev = local_rank % n;
  cuda_backend()->set_device(dev);
  return dev;
}

std::string current_gpu_description() {
  return cuda_backend() ? cuda_backend()->describe() : "no GPU (built without CUDA)";
}

void copy_tensor(Tensor dst, Tensor src) {
  LNS_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel())
      << dtype_name(dst.dtype) << dst.shape.str() << " <- " << dtype_name(src.dtype) << src.shape.str();
  if (dst.data == src.data || src.nbytes() == 0) return;
  if (dst.device == Device::CPU && src.device == Device::CPU) {
    std::memcpy(dst.data, src.data, src.nbytes());
    return;
  }
  DeviceBackend* b = cuda_backend();
  LNS_CHECK(b) << "a CUDA tensor reached a build without CUDA support";
  b->copy(dst.data, src.data, src.nbytes());
  if (dst.device == Device::CPU || src.device == Device::CPU) b->synchronize();
}

void guard_device_padding(Tensor padding) {
  if (padding.device != Device::CUDA || padding.nbytes() == 0 || !cuda_backend()) return;
  cuda_backend()->guard_padding(padding.data, padding.nbytes());
}

void zero_tensor(Tensor t) {
  if (t.nbytes() == 0) return;
  if (t.device == Device::CPU) {
    std::memset(t.data, 0, t.nbytes());
    return;
  }
  if (cuda_backend()) cuda_backend()->zero(t.data, t.nbytes());
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
  size_t free_b = 0, total_b = 0;
  if (cuda_device_count() == 0 || !cuda_backend()->memory_info(&free_b, &total_b)) return 0;
  return total_b - free_b;
}

void device_synchronize(Device d) {
  if (d == Device::CUDA && cuda_backend()) cuda_backend()->synchronize();
}

void* device_stream(Device d) {
  if (d == Device::CPU) return nullptr;
  LNS_CHECK(cuda_backend()) << "a CUDA stream asked of a build without CUDA support";
  return cuda_backend()->stream();
}

void add_device_sync_watch(Device d, void (*watch)(void* ctx), void* ctx) {
  LNS_CHECK(d == Device::CUDA && cuda_backend()) << "sync watches are for the CUDA stream";
  cuda_backend()->add_sync_watch(watch, ctx);
}

void remove_device_sync_watch(Device d, void* ctx) {
  if (d == Device::CUDA && cuda_backend()) cuda_backend()->remove_sync_watch(ctx);
}

void DeviceGraph::record(const std::function<void()>& work) {
  LNS_CHECK(cuda_backend()) << "DeviceGraph needs a CUDA build";
  reset();
  exec_ = cuda_backend()->graph_record(work);
}

void DeviceGraph::launch() const {
  LNS_CHECK(exec_) << "DeviceGraph::launch before record";
  cuda_backend()->graph_launch(exec_);
}

void DeviceGraph::reset() {
  if (exec_) cuda_backend()->graph_destroy(exec_);
  exec_ = nullptr;
}

}  // namespace lns
