// lns built without protobuf or Boost (CMakeLists.txt): no TensorBoard files. The trainer
// never gets a --tensorboard_dir then (tensorboard_dir_from_flags refuses one), so these
// are never reached with a directory.
#include "lns/core/errors.h"
#include "lns/train/tensorboard.h"

namespace lns {

std::string tensorboard_run_id(const std::string&) { return ""; }

int64_t truncate_tensorboard(const std::string&, int64_t, const std::string&) { return 0; }

std::unique_ptr<MetricsSink> make_tensorboard_sink(const std::string& dir, int64_t, const std::string&,
                                                   const std::string& flag) {
  fail(flag, "=", dir, ": this program was built without TensorBoard support (bash tools/install_deps.sh, then rebuild)");
}

}  // namespace lns
