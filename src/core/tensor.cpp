#include "lns/core/tensor.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include <absl/strings/str_join.h>

#include "lns/core/backend.h"
#include "lns/core/device.h"
#include "lns/core/errors.h"

namespace lns {
namespace {
// Bytes held by CUDA Buffers now and at most (peak memory in benchmarks and logs).
size_t g_cuda_bytes = 0, g_cuda_peak = 0;
// The same for host Buffers (what an allocation really holds: rounded to 64 bytes).
// Atomic: tools may build buffers on several threads.
std::atomic<size_t> g_host_bytes{0}, g_host_peak{0};
size_t host_alloc_size(size_t nbytes) { return (nbytes + 63) / 64 * 64; }
}  // namespace

size_t cuda_peak_allocated_bytes() { return g_cuda_peak; }
size_t cuda_allocated_bytes() { return g_cuda_bytes; }
size_t host_allocated_bytes() { return g_host_bytes.load(); }
size_t host_peak_allocated_bytes() { return g_host_peak.load(); }
void reset_host_peak_allocated_bytes() { g_host_peak.store(g_host_bytes.load()); }

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::I32: return 4;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::I32: return "I32";
  }
  return "?";
}

Shape::Shape(std::initializer_list<int64_t> d) {
  LNS_CHECK(d.size() <= kMaxDims);
  for (int64_t v : d) dims[ndim++] = v;
}

Shape::Shape(const std::vector<int64_t>& d) {
  LNS_CHECK(d.size() <= kMaxDims);
  for (int64_t v : d) dims[ndim++] = v;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= dims[i];
  return n;
}

std::string Shape::str() const { return "[" + absl::StrJoin(to_vector(), ", ") + "]"; }

bool Shape::operator==(const Shape& o) const {
  if (ndim != o.ndim) return false;
  for (int i = 0; i < ndim; ++i)
    if (dims[i] != o.dims[i]) return false;
  return true;
}

float* Tensor::f32() const {
  LNS_CHECK(dtype == DType::F32) << "tensor is " << dtype_name(dtype) << ", not F32";
  return static_cast<float*>(data);
}

int32_t* Tensor::i32() const {
  LNS_CHECK(dtype == DType::I32) << "tensor is " << dtype_name(dtype) << ", not I32";
  return static_cast<int32_t*>(data);
}

Tensor Tensor::view(Shape s) const {
  LNS_CHECK(s.numel() == numel()) << s.str() << " vs " << shape.str();
  Tensor t = *this;
  t.shape = s;
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  LNS_CHECK(shape.ndim >= 1 && 0 <= begin && begin <= end && end <= shape[0]);
  Tensor t = *this;
  const int64_t row = shape[0] ? numel() / shape[0] : 0;
  t.data = static_cast<char*>(data) + begin * row * dtype_size(dtype);
  t.shape.dims[0] = end - begin;
  return t;
}

Buffer::Buffer(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  if (nbytes == 0) return;
  if (device == Device::CPU) {
    // Zeroed by calloc, which maps large blocks as untouched zero pages: a page costs
    // its first write, not the allocation (memset here made a 1B model's CUDA start-up
    // touch 21 GB of host mirrors, about 12 s). 64-byte alignment: whole cache lines,
    // and what AVX-512 loads like.
    host_block_ = std::calloc(host_alloc_size(nbytes) + 64, 1);
    LNS_CHECK(host_block_ != nullptr) << "out of host memory allocating " << nbytes << " bytes";
    data_ = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(host_block_) + 63) / 64 * 64);
    const size_t now = g_host_bytes += host_alloc_size(nbytes);
    size_t peak = g_host_peak.load();
    while (now > peak && !g_host_peak.compare_exchange_weak(peak, now)) {
    }
  } else {
    DeviceBackend* b = device_backend(device);
    if (!b) LOG(FATAL) << "this build has no CUDA support (configure with -DLNS_CUDA=ON)";
    data_ = b->alloc(nbytes);  // zeroed
    if (!data_) {
      size_t free_b = 0, total_b = 0;
      b->memory_info(&free_b, &total_b);
      fail("out of GPU memory: allocating ", nbytes >> 20, " MiB with ", free_b >> 20, " MiB free of ",
           total_b >> 20, " MiB (", g_cuda_bytes >> 20,
           " MiB held by lns); lower --micro_batch_size or use more pipeline/tensor parallelism");
    }
    g_cuda_bytes += nbytes;
    g_cuda_peak = std::max(g_cuda_peak, g_cuda_bytes);
  }
}

Buffer::~Buffer() {
  if (!data_) return;
  if (device_ == Device::CPU) {
    std::free(host_block_);
    g_host_bytes -= host_alloc_size(nbytes_);
  } else {
    device_backend(device_)->free(data_);
    g_cuda_bytes -= nbytes_;
  }
}

Buffer::Buffer(Buffer&& o) noexcept
    : data_(o.data_), host_block_(o.host_block_), nbytes_(o.nbytes_), device_(o.device_) {
  o.data_ = nullptr;
  o.host_block_ = nullptr;
  o.nbytes_ = 0;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    this->~Buffer();
    data_ = o.data_;
    host_block_ = o.host_block_;
    nbytes_ = o.nbytes_;
    device_ = o.device_;
    o.data_ = nullptr;
    o.host_block_ = nullptr;
    o.nbytes_ = 0;
  }
  return *this;
}

Tensor Buffer::view(DType dtype, Shape shape, size_t byte_offset) const {
  LNS_CHECK(byte_offset + shape.numel() * dtype_size(dtype) <= nbytes_)
      << "view " << shape.str() << " at " << byte_offset << " exceeds buffer of " << nbytes_;
  Tensor t;
  t.data = static_cast<char*>(data_) + byte_offset;
  t.dtype = dtype;
  t.device = device_;
  t.shape = shape;
  return t;
}

OwnedTensor::OwnedTensor(DType dtype, Shape shape, Device device)
    : buffer(shape.numel() * dtype_size(dtype), device), t(buffer.view(dtype, shape)) {}

}  // namespace lns
