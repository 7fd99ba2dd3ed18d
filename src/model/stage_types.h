// The private types of LlamaStage (lns/model/stage.h), shared by its units: stage.cpp (the
// forward and backward), stage_params.cpp (which parameters a stage registers and how
// they start) and stage_buffers.cpp (the activation buffers it plans). Not a public
// header: only those files include it.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lns/model/stage.h"

namespace lns {

// "model.layers.<layer>.<suffix>": a block parameter's checkpoint name (global index).
inline std::string layer_name(int layer, const std::string& suffix) {
  return absl::StrCat("model.layers.", layer, ".", suffix);
}

// One application of a norm inside a sublayer (weights shared by all slots).
struct LlamaStage::NormUse {
  int gain = -1, bias = -1;  // parameter indices; gain < 0: no norm at this position
  float scale = 1.0f;        // LNS output scale
  int stat = -1;             // index of this norm's saved mean/rstd in each Slot
  float fixed0 = 0.0f, fixed = 0.0f;  // LN-free constant divisors (pos 0, pos > 0); 0: live
  int32_t eot = -1;                   // LN-free: end-of-text rows divide by fixed0 too
  bool active() const { return gain >= 0; }
};

struct LlamaStage::Sublayer {
  SublayerPlan plan;
  NormUse pre, out, add;
  // LN-free: the attention pre-norm as seen by v, once its divisor may differ from the
  // one q and k see (pre). Inactive until then: v reads pre's output.
  NormUse pre_v;
};

struct LlamaStage::Layer {
  int global = 0;
  int local = 0;  // index in layers_ (in its chunk's Slots: local - Slot::first_local)
  int first_param = -1;  // the layer's first registered parameter (lowest flat offset)
  BlockPlan plan;
  int wq = -1, wk = -1, wv = -1, wo = -1, wg = -1, wu = -1, wd = -1;
  int res[2] = {-1, -1};  // learned branch scale of each sublayer (scale_res_pre_norm)
  Sublayer sub[2];  // 0: attention, 1: MLP
  // A routed block (plan.route): the router, and path 1 as a twin Layer with the same
  // weights and route's sublayers (its activations in Slot::LayerActs::alt), so the
  // sublayer code runs both paths unchanged.
  int router = -1;
  bool is_alt = false;  // this is such a twin
  std::unique_ptr<Layer> alt;
};

// The activations of one micro-batch in flight: views into the slot's own buffers
// (`kept`) or, for what the layer's recompute mode drops, into the stage's shared
// Workspace, rewritten by each layer's forward and again by its backward's recompute.
struct LlamaStage::Slot {
  struct SubActs {
    Tensor x;                   // sublayer input (a view of the previous output)
    Tensor u, f, f2, r, y;      // [N,C]; u/f2/y only where the norm exists
    OwnedTensor uv;             // [NL,C] v's normalised input (this rank's rows), once pre_v is active (LN-free, late)
  };
  struct LayerActs {
    RecomputeMode mode = RecomputeMode::None;
    SubActs sub[2];
    Tensor q, k, v, ctx;        // [N,Hq*D], [N,Hkv*D] x2, [N,Hq*D]
    Tensor attn_saved;          // f32 attention_saved_shape(): [B,Hq,T,T] or [B,Hq,T]
    Tensor gate, up, act;       // [N,F]
    // Routed blocks: path 1's activations, the gate and the mixed output.
    std::unique_ptr<LayerActs> alt;
    OwnedTensor route_gate, route_soft, route_dgate;  // [B,2] f32
    OwnedTensor route_noise, route_zero;              // [B,2] f32: this forward's Gumbel noise, zeros
    OwnedTensor route_out;                            // [N,C] the block's output
    Tensor route_path[2];                             // each path's output (views)
  };
  std::vector<OwnedTensor> kept;  // the buffers of this micro-batch's layer activations
  OwnedTensor ids;        // [B,T] i32: first stage, or set_token_ids()
  OwnedTensor h0;         // [N,C] stage input
  std::vector<LayerActs> layers;
  std::vector<Tensor> mean, rstd;  // [N] f32 per NormUse::stat (mean: LayerNorm only)
  OwnedTensor hf;         // [N,C] final-norm output, last stage
  OwnedTensor logits;     // [N,V], overwritten by dlogits in backward
  OwnedTensor losses;     // [N]
  OwnedTensor losses_host;  // [N] host copy of losses (CUDA)
  bool gate_noise = false;  // set_gate_noise() armed route_noise for the next forward
  OwnedTensor rowmax, sumexp, target_logit;  // [N] loss statistics, reduced over tp
  OwnedTensor local_max;  // [N] this rank's row max, before the max over tp
  OwnedTensor targets;    // [N] i32, copied from the caller's
  bool loss_pending = false;  // loss() ran, so backward() may
  Tensor out;             // what forward returned
  int first_local = 0;    // layers[j] belongs to layers_[first_local + j] (its chunk's)
};

// What recomputing layers write instead of a slot: one layer's worth of the buffers
// their modes drop (allocated where some layer needs them), shared by every slot,
// layer and routed path, since each backward recomputes them just before reading them.
struct LlamaStage::Workspace {
  std::vector<OwnedTensor> buffers;
  Slot::LayerActs acts;
  std::vector<Tensor> mean, rstd;  // [N] per norm position in a layer (3 * sublayer + k)
};

// Gradient buffers for backward, reused by every layer and slot.
struct LlamaStage::Scratch {
  OwnedTensor d_a, d_b, dr, df, du;  // [N,C]
  OwnedTensor dq, dctx, dk, dv;      // [N,Hq*D], [N,Hq*D], [N,Hkv*D] x2
  OwnedTensor dgate, dup, dact;      // [N,F]
  OwnedTensor dhf;                   // [N,C]
  OwnedTensor du_v;                  // [NL,C] gradient of v's input, once some pre_v is active
  OwnedTensor route_d[2];            // [N,C] routed blocks: each path's output gradient
  // Sequence parallelism only: the full-token [N,C] buffers of the tensor-parallel
  // region (a gathered input, or a row-parallel partial result before its
  // reduce-scatter); the split-region buffers above are then [N/tp,C].
  OwnedTensor full_a, full_b;
};

// The residual stream between sublayers. In the pre-norm schemes a sublayer ends with
// r = alpha*x + f2 and the next one starts with N(r): the add is left pending here and
// done by that norm in the same pass (residual_norm_forward), 4 passes over [N,C]
// instead of 7 (copy, axpby, norm). The same arithmetic, so the same values.
struct LlamaStage::Stream {
  Tensor x;            // the buffer that holds the value (or will, once settled)
  Tensor base{}, delta{};  // pending: x = alpha * base + delta, not computed yet
  float alpha = 1.0f;
  bool pending() const { return !delta.empty(); }
};

// Generation's state (stage_decode.cpp), allocated by start_decode: each layer's
// key/value cache and the activations of one chunk of new tokens (C hidden, F the
// stored FFN width, V the stored vocabulary; device() dtypes, statistics f32).
struct LlamaStage::DecodeState {
  int64_t max_len = 0, chunk = 0;
  std::vector<OwnedTensor> k, v;      // per local layer [max_len, Hkv, D]: rotated keys, values
  std::unique_ptr<RopeTable> rope;    // [max_len, D/2] on the host
  OwnedTensor rope_dev[2];            // its copies on the device (CUDA)
  Tensor cos, sin;                    // the tables on device()
  OwnedTensor ids;                    // [chunk] i32 on device(): LN-free end-of-text rows read them
  OwnedTensor x[2];                   // [chunk, C] the residual stream and its spare
  OwnedTensor u, uv, f, f2, hf;       // [chunk, C]
  OwnedTensor q, ctx;                 // [chunk, Hq*D]
  OwnedTensor gate, up, act;          // [chunk, F]
  OwnedTensor scores;                 // [chunk, Hq, max_len] f32
  OwnedTensor mean, rstd;             // [chunk] f32 (mean: LayerNorm)
  OwnedTensor logits;                 // [chunk, V]
};

}  // namespace lns
