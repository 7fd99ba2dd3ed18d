#include "lns/core/op_profile.h"

#include <map>

#include "lns/core/backend.h"
#include "lns/core/errors.h"
#include "lns/core/op_table.h"

namespace lns {
namespace {

// The file that registered an op (src/cuda/<file>.cu or .cpp; the CPU's src/cpu/<file>.cpp
// names the same ops) -> its class. One table: the classes of the profile's rows.
const std::map<std::string, std::string>& file_classes() {
  static const std::map<std::string, std::string> m = {
      {"linear", "GEMMs (cuBLASLt)"},
      {"gemm", "GEMMs (cuBLASLt)"},
      {"fp8_linear", "GEMMs (cuBLASLt)"},  // its casts are segments of their own (fp8_cast)
      {"fp8_cast", "FP8 casts (scale, amax, transpose)"},
      {"attention", "attention"},
      {"norm", "norms with residual adds and LNS scale"},
      {"rope", "RoPE, SwiGLU, elementwise"},
      {"swiglu", "RoPE, SwiGLU, elementwise"},
      {"elementwise", "RoPE, SwiGLU, elementwise"},
      {"route", "RoPE, SwiGLU, elementwise"},
      {"embedding", "embedding, cross-entropy"},
      {"cross_entropy", "embedding, cross-entropy"},
      {"optimizer_kernels", "optimizer, gradient norm"},
      {"optimizer", "optimizer, gradient norm"},
  };
  return m;
}

}  // namespace

std::string op_class_of_file(const std::string& file) {
  const size_t slash = file.rfind('/');
  std::string base = file.substr(slash == std::string::npos ? 0 : slash + 1);
  const size_t dot = base.rfind('.');
  if (dot != std::string::npos) base.resize(dot);
  const auto it = file_classes().find(base);
  return it == file_classes().end() ? base : it->second;
}

const std::vector<std::string>& op_classes() {
  static const std::vector<std::string> order = {
      "GEMMs (cuBLASLt)", "FP8 casts (scale, amax, transpose)", "attention",
      "norms with residual adds and LNS scale", "RoPE, SwiGLU, elementwise", "embedding, cross-entropy",
      "optimizer, gradient norm"};
  return order;
}

namespace {
DeviceBackend& profiled_backend() {
  DeviceBackend* b = device_backend(Device::CUDA);
  if (!b) fail("the op profile (--profile) needs a CUDA build (-DLNS_CUDA=ON) and --device=cuda");
  return *b;
}
}  // namespace

void op_profile_start() {
  profiled_backend().profile_start();
  op_detail::g_profiling = true;
}

bool op_profile_running() { return op_detail::g_profiling; }

std::vector<OpClassTime> op_profile_stop() {
  DeviceBackend& b = profiled_backend();
  op_detail::g_profiling = false;
  std::map<std::string, OpClassTime> by;
  for (const OpTiming& t : b.profile_stop()) {
    OpClassTime& c = by[op_class_of_file(t.file)];
    c.ms += t.ms, c.ops += 1;
  }
  std::vector<OpClassTime> out;
  for (const std::string& name : op_classes()) {
    OpClassTime c = by[name];
    c.name = name;
    out.push_back(c);
    by.erase(name);
  }
  for (auto& [name, c] : by) c.name = name, out.push_back(c);
  return out;
}

}  // namespace lns
