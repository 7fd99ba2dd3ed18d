// Tensor: a typed, shaped view of memory it usually does not own.
// Storage is owned by Buffer (one allocation, CPU or CUDA); parameters, gradients
// and optimizer state are views into one flat Buffer each (see model/param_set.h).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace lns {

enum class DType : uint8_t { F32, BF16, I32 };
enum class Device : uint8_t { CPU, CUDA };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // safetensors spelling: "F32", "BF16", "I32"

constexpr int kMaxDims = 4;

struct Shape {
  std::array<int64_t, kMaxDims> dims{};
  int ndim = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d);
  explicit Shape(const std::vector<int64_t>& d);
  int64_t operator[](int i) const { return dims[i]; }
  int64_t numel() const;
  std::vector<int64_t> to_vector() const { return {dims.begin(), dims.begin() + ndim}; }
  std::string str() const;  // "[2, 7, 36]"
  bool operator==(const Shape& o) const;
};

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  Shape shape;

  bool empty() const { return data == nullptr; }
  int64_t numel() const { return shape.numel(); }
  int64_t dim(int i) const { return shape[i < 0 ? shape.ndim + i : i]; }
  size_t nbytes() const { return numel() * dtype_size(dtype); }
  float* f32() const;    // checks dtype
  int32_t* i32() const;  // checks dtype
  // Same memory, another shape with the same number of elements.
  Tensor view(Shape s) const;
  // Rows [begin, end) of the first dimension.
  Tensor rows(int64_t begin, int64_t end) const;
};

// One allocation; hands out tensor views. Zero-initialised.
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t nbytes, Device device = Device::CPU);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  Tensor view(DType dtype, Shape shape, size_t byte_offset = 0) const;
  Tensor f32(Shape shape) const { return view(DType::F32, shape); }

 private:
  void* data_ = nullptr;
  void* host_block_ = nullptr;  // CPU: what calloc returned (data_ is it rounded up to 64 bytes)
  size_t nbytes_ = 0;
  Device device_ = Device::CPU;
};

// A Buffer with exactly one tensor in it: for activations, tests and tools.
struct OwnedTensor {
  Buffer buffer;
  Tensor t;
  OwnedTensor() = default;
  OwnedTensor(DType dtype, Shape shape, Device device = Device::CPU);
  operator Tensor() const { return t; }  // NOLINT: a view is what callers want
  float* f32() const { return t.f32(); }
  int32_t* i32() const { return t.i32(); }
};

}  // namespace lns
