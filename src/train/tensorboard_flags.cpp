// The TensorBoard flag (lns/train/tensorboard.h; docs/training.md, "TensorBoard").
#include <gflags/gflags.h>

#include "lns/core/errors.h"
#include "lns/train/tensorboard.h"

DEFINE_string(tensorboard_dir, "",
              "Where rank 0 writes TensorBoard event files while training (the scalars of metrics.jsonl); "
              "empty: OUT_DIR/tensorboard (nothing without --out_dir); 'none': off.");

namespace lns {

std::string tensorboard_dir_from_flags(const std::string& out_dir) {
  if (FLAGS_tensorboard_dir == "none") return "";
#ifndef LNS_WITH_TENSORBOARD
  // Built where protobuf or Boost was missing (CMakeLists.txt): the default quietly
  // writes nothing but a warning; asking for a directory is an error.
  LNS_REQUIRE(FLAGS_tensorboard_dir.empty(), "--tensorboard_dir=", FLAGS_tensorboard_dir,
              ": this lns_train was built without TensorBoard support (protobuf and Boost were missing when "
              "it was configured: bash tools/install_deps.sh, then rebuild); --tensorboard_dir=none runs without");
  if (!out_dir.empty())
    LOG(WARNING) << "no TensorBoard event files: this lns_train was built without TensorBoard support "
                    "(protobuf and Boost were missing when it was configured: bash tools/install_deps.sh)";
  return "";
#else
  if (!FLAGS_tensorboard_dir.empty()) return FLAGS_tensorboard_dir;
  return out_dir.empty() ? "" : out_dir + "/tensorboard";
#endif
}

}  // namespace lns
