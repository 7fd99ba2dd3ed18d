#include "lns/model/recompute.h"

#include "lns/core/errors.h"
#include "lns/core/files.h"

namespace lns {

const char* recompute_mode_name(RecomputeMode m) {
  switch (m) {
    case RecomputeMode::None: return "none";
    case RecomputeMode::Selective: return "selective";
    case RecomputeMode::Full: return "full";
  }
  return "?";
}

RecomputeMode parse_recompute_mode(const std::string& s, const std::string& flag) {
  for (RecomputeMode m : {RecomputeMode::None, RecomputeMode::Selective, RecomputeMode::Full})
    if (s == recompute_mode_name(m)) return m;
  fail(flag, "=", printable(s), " is not a recomputation mode; expected none, selective or full");
}

RecomputeMode layer_recompute(RecomputeMode mode, int recompute_layers, int local) {
  if (mode != RecomputeMode::Full || recompute_layers == 0) return mode;
  return local < recompute_layers ? RecomputeMode::Full : RecomputeMode::None;
}

}  // namespace lns
