// The FP8 scaling state of a stage (include/lns/model/fp8_state.h).
#include "lns/model/fp8_state.h"

#include <algorithm>
#include <map>

#include "lns/core/device.h"
#include "lns/core/errors.h"

namespace lns {
namespace {
constexpr Fp8Format kFormat[3] = {Fp8Format::E4M3, Fp8Format::E4M3, Fp8Format::E5M2};  // x, w, dy
}  // namespace

const char* fp8_block_linear_name(int k) {
  static const char* const names[kFp8BlockLinears] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                      "gate_proj", "up_proj", "down_proj"};
  LNS_CHECK(k >= 0 && k < kFp8BlockLinears) << k;
  return names[k];
}

const char* fp8_role_name(int r) {
  static const char* const names[3] = {"x", "w", "dy"};
  LNS_CHECK(r >= 0 && r < 3) << r;
  return names[r];
}

Fp8State::Fp8State(const ParamSet& params, const std::vector<int>& weights, Fp8Mode mode,
                   const Fp8ScalingConfig& config, Device device, const std::vector<int>& x_from)
    : params_(&params), blockwise_(mode == Fp8Mode::Blockwise), weights_(weights),
      row_of_weight_(static_cast<size_t>(params.size()), -1) {
  LNS_CHECK(mode != Fp8Mode::None);
  config.validate("--fp8_");
  std::map<int, int> per_layer;  // FP8 linears seen so far, by layer
  for (const int w : weights) {
    LNS_CHECK(w >= 0 && w < params.size() && row_of_weight_[static_cast<size_t>(w)] < 0) << "fp8 weight " << w;
    row_of_weight_[static_cast<size_t>(w)] = static_cast<int>(scales_.size());
    std::string base = params.info(w).name;
    if (base.size() > 7 && base.compare(base.size() - 7, 7, ".weight") == 0) base.resize(base.size() - 7);
    const int layer = params.info(w).layer, linear = per_layer[layer]++;
    for (int r = 0; r < 3; ++r) {
      scales_.emplace_back(kFormat[r], config);
      Fp8Health h;
      h.name = base + "." + fp8_role_name(r);
      h.layer = layer, h.linear = linear, h.tensor = r;
      health_.push_back(h);
    }
  }
  LNS_CHECK(x_from.empty() || x_from.size() == weights.size()) << x_from.size() << " x_from for " << weights.size();
  for (int64_t r = 0; r < rows(); ++r) source_row_.push_back(r);
  for (size_t i = 0; i < x_from.size(); ++i) {
    const int from = x_from[i];
    LNS_CHECK(has(from) && row_of_weight_[size_t(from)] <= row_of_weight_[size_t(weights[i])])
        << "fp8: x_from " << from << " for weight " << weights[i] << " is not an earlier FP8 weight";
    source_row_[size_t(row_of_weight_[size_t(weights[i])])] = row_of_weight_[size_t(from)];
  }
  table_ = OwnedTensor(DType::F32, {rows(), kFp8Fields}, device);
  upload_scales();
}

bool Fp8State::has(int weight) const {
  return weight >= 0 && weight < static_cast<int>(row_of_weight_.size()) && row_of_weight_[size_t(weight)] >= 0;
}

Fp8Linear Fp8State::linear(int weight) const {
  LNS_CHECK(has(weight)) << "no FP8 rows for parameter " << weight;
  const int64_t r = row_of_weight_[static_cast<size_t>(weight)];
  Fp8Linear f{table_.t, source_row_[size_t(r)], r + 1, r + 2, blockwise_};
  if (step_casts_) f.w_cast = w_casts_[static_cast<size_t>(r / 3)].t;
  return f;
}

void Fp8State::split_input(int weight) {
  LNS_CHECK(has(weight)) << "no FP8 rows for parameter " << weight;
  const int r = row_of_weight_[static_cast<size_t>(weight)];
  source_row_[static_cast<size_t>(r)] = r;
}

void Fp8State::begin_step() {
  upload_scales();
  step_casts_ = false;
  w_casts_.resize(weights_.size());
  for (size_t i = 0; i < weights_.size(); ++i) {
    const Tensor w = params_->compute(weights_[i]);
    const Fp8Linear f = linear(weights_[i]);
    const int64_t n = fp8_weight_cast_numel(w, f);
    if (w_casts_[i].t.numel() != n) w_casts_[i] = OwnedTensor(DType::F32, {n}, table_.t.device);
    fp8_cast_weight(w_casts_[i], w, f);
  }
  step_casts_ = true;
}

void Fp8State::upload_scales() {
  std::vector<float> t(static_cast<size_t>(rows() * kFp8Fields), 0.0f);
  for (int64_t r = 0; r < rows(); ++r) {
    t[size_t(r * kFp8Fields + kFp8Scale)] = scales_[size_t(r)].scale();
    t[size_t(r * kFp8Fields + kFp8ScaleInv)] = scales_[size_t(r)].inverse();
  }
  if (!t.empty()) copy_tensor(table_.t, Tensor{t.data(), DType::F32, Device::CPU, table_.t.shape});
}

const std::vector<Fp8Health>& Fp8State::end_step(const std::vector<Communicator*>& groups) {
  step_casts_ = false;
  const std::vector<float> t = to_host_f32(table_.t);
  const size_t R = scales_.size();
  std::vector<double> amax(R), counts(R * 4);
  for (size_t r = 0; r < R; ++r) {
    const float* row = t.data() + source_row_[r] * kFp8Fields;  // a group's x: its first's casts
    amax[r] = row[kFp8Amax];
    for (int c = 0; c < 4; ++c) counts[r * 4 + size_t(c)] = row[kFp8Saturated + c];
  }
  for (Communicator* g : groups) {
    if (g == nullptr || g->size() == 1 || R == 0) continue;
    g->all_reduce(amax.data(), static_cast<int>(R), ReduceOp::Max);
    g->all_reduce(counts.data(), static_cast<int>(R * 4), ReduceOp::Sum);
  }
  for (size_t r = 0; r < R; ++r) {
    Fp8Health& h = health_[r];
    h.amax = static_cast<float>(amax[r]);
    h.scale = blockwise_ ? 0.0f : scales_[r].scale();  // 0: scaled per tile
    h.saturated = counts[r * 4], h.flushed = counts[r * 4 + 1];
    h.nonfinite = counts[r * 4 + 2], h.elements = counts[r * 4 + 3];
    if (h.elements > 0 && !blockwise_) scales_[r].record(h.amax);  // a tensor no cast touched keeps its history
  }
  upload_scales();
  return health_;
}

std::vector<std::vector<float>> Fp8State::state() const {
  std::vector<std::vector<float>> s;
  if (blockwise_) return s;
  for (const Fp8DelayedScale& d : scales_) s.push_back(d.state());
  return s;
}

void Fp8State::restore(const std::vector<std::vector<float>>& s, const std::string& what) {
  if (blockwise_) {
    LNS_REQUIRE(s.empty(), what, ": FP8 scaling state for ", s.size(), " tensors, but --fp8=blockwise keeps none");
    return;
  }
  LNS_REQUIRE(s.size() == scales_.size(), what, ": FP8 scaling state for ", s.size(), " tensors, expected ",
              scales_.size());
  for (size_t r = 0; r < s.size(); ++r) scales_[r].restore(s[r], what + " (" + health_[r].name + ")");
  step_casts_ = false;  // cast with the scales restored over
  upload_scales();
}

}  // namespace lns
