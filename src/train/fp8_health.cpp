#include "lns/train/fp8_health.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lns/core/errors.h"
#include "lns/model/fp8_state.h"
#include "parallel/process_grid.h"

namespace lns {

nlohmann::json fp8_health_record(ProcessGrid& grid, const Fp8State& fp8, int num_layers, int64_t step) {
  constexpr int kPer = kFp8BlockLinears * 3, kVals = 6;
  const int L = num_layers;
  std::vector<double> v(static_cast<size_t>(L) * kPer * kVals, 0.0);
  if (grid.coords.tp == 0 && grid.coords.dp == 0) {  // end_step reduced over tp and dp already
    const std::vector<Fp8Health>& hs = fp8.last_health();
    for (const Fp8Health& h : hs) {
      LNS_CHECK(h.layer >= 0 && h.layer < L && h.linear >= 0 && h.linear < kFp8BlockLinears) << h.name;
      double* o = v.data() + (static_cast<size_t>(h.layer) * kPer + h.linear * 3 + h.tensor) * kVals;
      o[0] = h.amax, o[1] = h.scale, o[2] = h.saturated, o[3] = h.flushed, o[4] = h.nonfinite, o[5] = h.elements;
    }
  }
  grid.world().all_reduce(v.data(), static_cast<int>(v.size()), ReduceOp::Sum);
  if (grid.rank != 0) return nullptr;
  nlohmann::json rows = nlohmann::json::array();
  struct Worst { double frac = 0; std::string name; } sat, flush;
  double nonfinite = 0;
  for (int l = 0; l < L; ++l)
    for (int k = 0; k < kPer; ++k) {
      const double* o = v.data() + (static_cast<size_t>(l) * kPer + k) * kVals;
      if (o[5] <= 0) continue;
      const std::string name = absl::StrCat("layers.", l, ".", fp8_block_linear_name(k / 3), ".", fp8_role_name(k % 3));
      const double fs = o[2] / o[5], ff = o[3] / o[5];
      if (fs > sat.frac || sat.name.empty()) sat = {fs, name};
      if (ff > flush.frac || flush.name.empty()) flush = {ff, name};
      nonfinite += o[4];
      rows.push_back({{"layer", l}, {"linear", fp8_block_linear_name(k / 3)}, {"tensor", fp8_role_name(k % 3)},
                      {"amax", o[0]}, {"scale", o[1]}, {"saturated", fs}, {"flushed", ff}, {"nonfinite", o[4]}});
    }
  LOG(INFO) << absl::StrFormat("fp8 step %d: most saturated %.3g%% (%s) | most flushed %.3g%% (%s) | %.0f non-finite",
                               step, 100 * sat.frac, sat.name, 100 * flush.frac, flush.name, nonfinite);
  return {{"step", step}, {"fp8", rows}};
}

}  // namespace lns
