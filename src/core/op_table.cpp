// The ops' dispatch tables (lns/core/op_table.h): what core keeps beside each op's slots.
#include "lns/core/op_table.h"

#include "lns/core/backend.h"
#include "lns/core/device.h"
#include "lns/core/errors.h"

namespace lns {
namespace {
std::vector<RegisteredOp>& registry() {
  static std::vector<RegisteredOp> ops;
  return ops;
}
}  // namespace

namespace op_detail {

bool g_profiling = false;

void missing(const char* op, Device d) {
  LNS_CHECK(false) << "no " << device_name(d) << " implementation of " << op << " is registered"
                   << (d == Device::CUDA ? ": a CUDA tensor reached a build without CUDA support (-DLNS_CUDA=OFF)"
                                         : "");
  std::abort();  // LNS_CHECK(false) does not return
}

void profile_begin(Device d, const char* file) { device_backend(d)->profile_op_begin(file); }
void profile_end(Device d) { device_backend(d)->profile_op_end(); }

void record(const char* op, Device d, const char* file) { registry().push_back({op, d, file}); }

}  // namespace op_detail

const std::vector<RegisteredOp>& registered_ops() { return registry(); }

}  // namespace lns
