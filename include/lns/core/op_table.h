// Dispatch of the ops (lns/core/ops.h, lns/core/fp8_linear.h) on their tensors' device: one
// table per op, one entry per device, filled at start-up by the backends (the CPU's in
// src/cpu, CUDA's in src/cuda) and read by the op's one declaration:
//
//   // ops.h: the declaration is the dispatch
//   inline void swiglu_forward(Tensor out, Tensor gate, Tensor up) {
//     LNS_OP(swiglu_forward, out.device)(out, gate, up);
//   }
//   // src/cpu/swiglu.cpp and src/cuda/elementwise.cu: an implementation each, same signature
//   LNS_REGISTER_OPS(Device::CPU) { LNS_REGISTER_OP(swiglu_forward, cpu::swiglu_forward); }
//
// The registration is checked at compile time against the declaration's signature.
// While the op profile runs (lns/core/op_profile.h), a call on a device other than the CPU
// is bracketed by that backend's profile hooks, under the file that registered it.
#pragma once
#include <utility>

#include "lns/core/tensor.h"

namespace lns {

constexpr int kDeviceCount = 2;  // Device::CPU, Device::CUDA
constexpr int device_index(Device d) { return static_cast<int>(d); }

// Op F's implementation on each device (nullptr: none registered) and the file that
// registered it. Constant-initialized, so registrars may run in any order.
template <auto F>
struct OpSlot {
  static inline decltype(F) impl[kDeviceCount] = {};
  static inline const char* file[kDeviceCount] = {};
};

namespace op_detail {
extern bool g_profiling;  // between op_profile_start and op_profile_stop
[[noreturn]] void missing(const char* op, Device d);
void profile_begin(Device d, const char* file);
void profile_end(Device d);
void record(const char* op, Device d, const char* file);
}  // namespace op_detail

// One call of op F on device d: looks the implementation up (fatal when the device has
// none), times it while the op profile runs, and forwards the arguments.
template <auto F>
class OpCall {
 public:
  OpCall(const char* name, Device d) : fn_(OpSlot<F>::impl[device_index(d)]), device_(d) {
    if (!fn_) op_detail::missing(name, d);
    if (op_detail::g_profiling && d != Device::CPU) {
      op_detail::profile_begin(d, OpSlot<F>::file[device_index(d)]);
      timed_ = true;
    }
  }
  ~OpCall() {
    if (timed_) op_detail::profile_end(device_);
  }
  OpCall(const OpCall&) = delete;
  OpCall& operator=(const OpCall&) = delete;
  template <class... Args>
  decltype(auto) operator()(Args&&... args) const {
    return fn_(std::forward<Args>(args)...);
  }

 private:
  decltype(F) fn_;
  Device device_;
  bool timed_ = false;
};

// A backend's implementation of op F on `device` (the signatures must match).
template <auto F>
void register_op(Device device, decltype(F) impl, const char* name, const char* file) {
  OpSlot<F>::impl[device_index(device)] = impl;
  OpSlot<F>::file[device_index(device)] = file;
  op_detail::record(name, device, file);
}

// Every op registered so far: "name on device (file)", in registration order (tests).
struct RegisteredOp {
  const char* name;
  Device device;
  const char* file;
};
const std::vector<RegisteredOp>& registered_ops();

}  // namespace lns

// Calls op `op` (a function of namespace lns) on `device`.
#define LNS_OP(op, device) ::lns::OpCall<&::lns::op>(#op, (device))

// A backend file's registrations, run at start-up:
//   LNS_REGISTER_OPS(Device::CUDA) { LNS_REGISTER_OP(axpby, cuda::axpby); ... }
#define LNS_REGISTER_OPS(device)                                                  \
  static void lns_register_ops_(::lns::Device lns_device_);                      \
  [[maybe_unused]] static const bool lns_ops_registered_ = (lns_register_ops_(device), true); \
  static void lns_register_ops_(::lns::Device lns_device_)
#define LNS_REGISTER_OP(op, impl) ::lns::register_op<&::lns::op>(lns_device_, (impl), #op, __FILE__)
