// The FP8 scaling state of a stage (--fp8; lns/core/fp8_linear.h): one Fp8DelayedScale
// per FP8 tensor of each linear the stage holds (its input x and weight w in E4M3, its
// output gradient dy in E5M2), the table its casts read the scales from and add their
// health to, the weights cast once for the step (fp8_cast_weight), and the step
// boundaries that set these up and turn what a step saw into the next step's scales.
// --fp8=blockwise keeps no scales (its tiles are scaled at each cast): its table carries
// only the health.
//
// Rows are keyed by the weight's parameter index, so a routed block's twin path (same
// weights) shares its layer's rows. The amax a scale is computed from is the max over
// every cast of the step: every micro-batch, and every tensor-parallel and data-parallel
// rank (end_step reduces it), so that any layout casts with the single rank's scales.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lns/core/fp8_linear.h"
#include "lns/core/fp8_recipe.h"
#include "lns/model/param_set.h"
#include "parallel/communicator.h"

namespace lns {

// A block's FP8 linears, in the order the stage gives them (its rows' order, and the
// metrics' names): q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; each
// with three tensors in row order: x, w, dy.
constexpr int kFp8BlockLinears = 7;
const char* fp8_block_linear_name(int k);  // 0 <= k < kFp8BlockLinears
const char* fp8_role_name(int r);          // 0 x, 1 w, 2 dy

// What one FP8 tensor's casts saw in a step (summed over the ranks end_step reduces over).
// An activation or gradient counts every micro-batch's cast; a weight, cast once per step
// by begin_step, counts once per data-parallel replica. The fractions (saturated or
// flushed over elements) and the amax are the single rank's in any layout.
struct Fp8Health {
  std::string name;   // "model.layers.3.self_attn.q_proj.x" (.x, .w or .dy)
  int layer = -1;     // global layer index
  int linear = -1;    // which of its layer's FP8 linears, in the order given (fp8_block_linear_name for a block)
  int tensor = -1;    // 0 x, 1 w, 2 dy (fp8_role_name)
  float amax = 0.0f, scale = 0.0f;  // the step's amax, and the scale its casts used
  double saturated = 0, flushed = 0, nonfinite = 0, elements = 0;
};

class Fp8State {
 public:
  // `weights`: the parameter indices of the linear weights that run in FP8. The table is
  // allocated on `device`; every scale starts at 1 (Transformer Engine's start). `params`
  // must outlive the state: begin_step casts its compute weights. `x_from` (empty, or
  // one entry per weight): the weight, earlier in `weights`, whose linear reads the same
  // input (q for k and v, gate for up), or the weight itself. Such a group casts its
  // input once (linear_*_fp8_shared), so linear() gives all of it the first's x row, and
  // the others' x rows report that row's health and follow its scale.
  Fp8State(const ParamSet& params, const std::vector<int>& weights, Fp8Mode mode, const Fp8ScalingConfig& config,
           Device device, const std::vector<int>& x_from = {});
  bool blockwise() const { return blockwise_; }
  bool has(int weight) const;
  // The rows of that weight's linear, with its step cast while a step runs (between
  // begin_step and end_step).
  Fp8Linear linear(int weight) const;
  int64_t rows() const { return static_cast<int64_t>(scales_.size()); }

  // Before a step's first forward, once the step's compute weights are in place: clears
  // what casts outside training (evaluation, diagnostics) added since the last step, so
  // only the step's own casts count, and casts every FP8 weight for the step (its health
  // recorded once). Weights and scales must not change until end_step.
  void begin_step();
  // From now on `weight`'s linear reads an input of its own (LN-free's split value norm,
  // docs/ln_free.md): its x row leaves its group. Its scaling history is the group's
  // already (end_step records a group's amax into every x row of it).
  void split_input(int weight);
  bool step_casts() const { return step_casts_; }  // between begin_step and end_step (or restore)
  // After a step's backward (before the next forward): reduces the step's amax (max) and
  // counts (sum) over `groups` (the tensor- and data-parallel groups; null entries
  // skipped), records the amaxes, writes the next scales and clears the counts. The
  // step casts are dropped (the optimizer moves the weights next): until the next
  // begin_step, the ops cast w at each call. Collective over each group. Returns this
  // stage's health for the step.
  const std::vector<Fp8Health>& end_step(const std::vector<Communicator*>& groups);
  const std::vector<Fp8Health>& last_health() const { return health_; }

  // The scaling state of every row, in row order (for checkpoints): Fp8DelayedScale::state;
  // none with --fp8=blockwise (nothing carries over from a step to the next).
  std::vector<std::vector<float>> state() const;
  void restore(const std::vector<std::vector<float>>& s, const std::string& what);

 private:
  void upload_scales();
  const ParamSet* params_;
  bool blockwise_ = false;
  std::vector<int> weights_;        // parameter indices, in row order (linear i: rows 3i..3i+2)
  std::vector<int> row_of_weight_;  // by parameter index: first row (x; w +1, dy +2), -1 none
  std::vector<int64_t> source_row_;  // by row: the row its casts record into (a group's first x row, else itself)
  std::vector<OwnedTensor> w_casts_;  // by linear: fp8_cast_weight's output, allocated at the first begin_step
  bool step_casts_ = false;           // w_casts_ hold this step's weights
  std::vector<Fp8DelayedScale> scales_;
  std::vector<Fp8Health> health_;   // names and layers set at construction
  OwnedTensor table_;               // [rows, kFp8Fields] f32 on the device
};

}  // namespace lns
