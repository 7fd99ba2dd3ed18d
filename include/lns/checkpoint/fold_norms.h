// lns_convert fold-norms (docs/ln_free.md): an LN-free model whose every norm divides
// by one constant is a fixed linear map per norm, so the norms can be multiplied into
// the linears they feed and dropped.
//
// A pre-norm of layer l computes u = s_l * (x / d) * g (RMSNorm; s_l the depth scale
// block_plan gives, 1/sqrt(l) for LNS, 1 otherwise; d the fixed divisor; g the gain),
// and every consumer is a linear y = W u. So y = W' x with
//   W'[o, c] = W[o, c] * s_l * g[c] / d
// exactly. q and k take the attention norm with attn_qk's divisor, v with attn_v's;
// gate and up take the MLP pre-norm's; lm_head takes the final norm (s = 1), and a
// tied embedding is untied (the embedding keeps its rows, lm_head gets the folded ones).
//
// Supported: RMSNorm, every scheme whose blocks have pre-norms only (pre, lns,
// scaled_init, scale_res_pre_norm, hybrids of those). Refused with one line: LayerNorm
// (its bias b adds W s b to q/k/v/gate/up/lm_head, and our linears have no bias; the
// mean subtraction alone would fold as the centering matrix I - 11^T/C), schemes with
// post-, sandwich- or routed norms (LN-free replaces pre-norms only), and any norm whose
// divisor is not one constant for every row (still live, position 0 or end-of-text case).
#pragma once
#include <map>
#include <set>
#include <string>

#include "lns/checkpoint/checkpoint.h"
#include "lns/model/config.h"
#include "lns/checkpoint/manifest.h"

namespace lns {

// The checkpoint's tensors as the folded model's: the pre-norm gains and model.norm
// absent, q/k/v/gate/up/lm_head folded. Parameters only: AdamW's moments belonged to
// the unfolded weights, so the output has no optimizer state. The constructor checks
// everything (UserError naming the input, the norm and the layer).
class FoldedNorms : public TensorSource {
 public:
  explicit FoldedNorms(const Checkpoint& ck);
  const LlamaConfig& config() const { return cfg_; }  // folded_norms, untied
  // The input's run state without its ln_free record (nothing is left to fix) and with
  // a "fold-norms" entry in conversions.
  const RunState& run_state() const { return state_; }

  bool has(const std::string& name, const std::string& kind) const override;
  std::vector<float> logical(const std::string& name, const std::string& kind) const override;
  std::vector<int64_t> logical_shape(const std::string& name) const override;
  std::string where() const override { return src_.where(); }

 private:
  // name of a linear of the folded model -> (the gain it takes, s / d)
  struct Fold {
    std::string gain;
    double factor = 1.0;
  };
  const Checkpoint& src_;
  LlamaConfig cfg_;
  RunState state_;
  std::map<std::string, Fold> folds_;
  std::set<std::string> names_;  // the folded model's parameters
};

}  // namespace lns
