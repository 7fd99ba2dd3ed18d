// A kernel launch in the SIMT emulator (what LNS_LAUNCH of cuda/launch.h expands to).
// The arguments are converted to the kernel's parameter types and copied, as the
// real launch does; every pointer argument must be null or point into a live device
// allocation (a host pointer handed to a kernel is reported); the grid is checked
// against the limits of the device and queued on the stream.
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace lns::sim {

// Where a launch came from, for the messages of every check.
struct LaunchSite {
  const char* kernel;  // the kernel expression as written at the launch
  const char* file;
  int line;
};

// Checks grid/block/shared memory against the device limits (fail() otherwise),
// then queues the grid on `stream`: `thread_body` runs once per CUDA thread, in a
// fiber, with threadIdx/blockIdx set.
void launch_grid(const LaunchSite& site, const void* func, dim3 grid, dim3 block, size_t shared_bytes,
                 cudaStream_t stream, std::function<void()> thread_body, std::vector<const void*> pointers);
// Pointer argument `index` of the launch at `site`: null or inside a live device allocation.
void check_pointer_arg(const LaunchSite& site, int index, const void* p);
// The running block's dynamic shared memory (LNS_EXTERN_SHARED).
void* dynamic_shared();

template <typename... P>
class Launch {
 public:
  Launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes,
         cudaStream_t stream, const char* file, int line)
      : site_{name, file, line}, kernel_(kernel), grid_(grid), block_(block), shared_(shared_bytes),
        stream_(stream) {}

  template <typename... A>
  void operator()(A&&... args) const {
    static_assert(sizeof...(A) == sizeof...(P), "wrong number of kernel arguments");
    std::tuple<std::decay_t<P>...> copy(std::forward<A>(args)...);
    std::vector<const void*> pointers;
    check_pointers(copy, pointers, std::index_sequence_for<P...>{});
    auto* k = kernel_;
    launch_grid(site_, reinterpret_cast<const void*>(k), grid_, block_, shared_, stream_,
                [k, copy]() { std::apply(k, copy); }, std::move(pointers));
  }

 private:
  template <typename Tuple, size_t... I>
  void check_pointers(const Tuple& t, std::vector<const void*>& out, std::index_sequence<I...>) const {
    (check_one(int(I), std::get<I>(t), out), ...);
  }
  template <typename T>
  void check_one(int index, const T& v, std::vector<const void*>& out) const {
    if constexpr (std::is_pointer_v<T>) {
      check_pointer_arg(site_, index, static_cast<const void*>(v));
      out.push_back(static_cast<const void*>(v));
    }
  }

  LaunchSite site_;
  void (*kernel_)(P...);
  dim3 grid_, block_;
  size_t shared_;
  cudaStream_t stream_;
};

}  // namespace lns::sim
