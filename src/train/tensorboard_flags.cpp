// The TensorBoard flag (lns/tensorboard.h; docs/training.md, "TensorBoard").
#include <gflags/gflags.h>

#include "lns/tensorboard.h"

DEFINE_string(tensorboard_dir, "",
              "Where rank 0 writes TensorBoard event files while training (the scalars of metrics.jsonl); "
              "empty: OUT_DIR/tensorboard (nothing without --out_dir); 'none': off.");

namespace lns {

std::string tensorboard_dir_from_flags(const std::string& out_dir) {
  if (FLAGS_tensorboard_dir == "none") return "";
  if (!FLAGS_tensorboard_dir.empty()) return FLAGS_tensorboard_dir;
  return out_dir.empty() ? "" : out_dir + "/tensorboard";
}

}  // namespace lns
