#include "lns/stage.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <glog/logging.h>

#include "lns/device.h"
#include "lns/errors.h"
#include "lns/ops.h"
#include "lns/rng.h"

namespace lns {
namespace {

std::string layer_name(int layer, const std::string& suffix) {
  return absl::StrCat("model.layers.", layer, ".", suffix);
}

void copy(Tensor dst, Tensor src) { copy_tensor(dst, src); }

}  // namespace

// One application of a norm inside a sublayer (weights shared by all slots).
struct LlamaStage::NormUse {
  int gain = -1, bias = -1;  // parameter indices; gain < 0: no norm at this position
  float scale = 1.0f;        // LNS output scale
  int stat = -1;             // index of this norm's saved mean/rstd in each Slot
  float fixed0 = 0.0f, fixed = 0.0f;  // LN-free constant divisors (pos 0, pos > 0); 0: live
  bool active() const { return gain >= 0; }
};

struct LlamaStage::Sublayer {
  SublayerPlan plan;
  NormUse pre, out, add;
};

struct LlamaStage::Layer {
  int global = 0;
  int local = 0;  // index in layers_ (and in each Slot's layers)
  int first_param = -1;  // the layer's first registered parameter (lowest flat offset)
  BlockPlan plan;
  int wq = -1, wk = -1, wv = -1, wo = -1, wg = -1, wu = -1, wd = -1;
  int res[2] = {-1, -1};  // learnable residual scale of each sublayer (scale_res_pre_norm)
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
  OwnedTensor ids;        // [B,T] i32, first stage
  OwnedTensor h0;         // [N,C] stage input
  std::vector<LayerActs> layers;
  std::vector<Tensor> mean, rstd;  // [N] f32 per NormUse::stat (mean: LayerNorm only)
  OwnedTensor hf;         // [N,C] final-norm output, last stage
  OwnedTensor logits;     // [N,V], overwritten by dlogits in backward
  OwnedTensor losses;     // [N]
  OwnedTensor losses_host;  // [N] host copy of losses (CUDA)
  bool gate_noise = false;  // set_gate_noise() armed route_noise for the next forward
  OwnedTensor rowmax, sumexp, target_logit;  // [N] loss statistics, reduced over tp
  OwnedTensor targets;    // [N] i32, copied from the caller's
  bool loss_pending = false;  // loss() ran, so backward() may
  Tensor out;             // what forward returned
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
  OwnedTensor route_d[2];            // [N,C] routed blocks: each path's output gradient
};

// The residual stream between sublayers. In the pre-norm schemes a sublayer ends with
// r = alpha*x + f2 and the next one starts with N(r): the add is left pending here and
// done by that norm in the same pass (residual_norm_forward), 4 passes over [N,C]
// instead of 7 (copy, axpby, norm). The same arithmetic, so the same values.
struct LlamaStage::Stream {
  Tensor x;            // the buffer that holds the value (or will, once settled)
  Tensor base, delta;  // pending: x = alpha * base + delta, not computed yet
  float alpha = 1.0f;
  bool pending() const { return !delta.empty(); }
};

LlamaStage::~LlamaStage() = default;

LlamaStage::LlamaStage(const LlamaConfig& cfg, StageSpec spec, TensorParallel tp, ParamsOnly)
    : cfg_(cfg), spec_(spec), B_(1), T_(1), tp_(tp), rope_(1, cfg.head_dim(), cfg.rope_theta) {
  cfg_.validate();
  init_dims();
  register_params();
}

std::vector<ParamInfo> LlamaStage::model_params(const LlamaConfig& cfg) {
  return LlamaStage(cfg, StageSpec::whole(cfg), {}, ParamsOnly{}).params().infos();
}

ParamSet LlamaStage::stage_params(const LlamaConfig& cfg, StageSpec spec, TensorParallel tp) {
  LlamaStage s(cfg, spec, tp, ParamsOnly{});
  return std::move(s.params_);
}

void LlamaStage::init_dims() {
  LNS_CHECK(cfg_.num_heads % tp_.size == 0 && cfg_.num_kv_heads % tp_.size == 0)
      << "layout_for_model() must reject this layout";
  Hq_ = cfg_.num_heads / tp_.size;
  Hkv_ = cfg_.num_kv_heads / tp_.size;
  QD_ = Hq_ * cfg_.head_dim();
  KD_ = Hkv_ * cfg_.head_dim();
  // Stored padded to the device's GEMM alignment (64 on CUDA: F = 5461 is held as
  // 5504 zero-padded columns, the same function); the CPU stores the tp share as is.
  const int64_t align = gemm_dim_align(device_);
  fshard_ = shard_range(cfg_.intermediate_size, tp_.size, tp_.rank, align);
  vshard_ = shard_range(cfg_.vocab_size, tp_.size, tp_.rank, align);
}

LlamaStage::LlamaStage(const LlamaConfig& cfg, StageSpec spec, int64_t micro_batch, int64_t seq_len,
                       int num_slots, TensorParallel tp, Device device)
    : cfg_(cfg), spec_(spec), B_(micro_batch), T_(seq_len), tp_(tp),
      rope_(seq_len, cfg.head_dim(), cfg.rope_theta), device_(device),
      act_(lns::activation_dtype(device)) {
  cfg_.validate();
  init_dims();
  attn_ = choose_attention_impl(cfg_.attention, device_, cfg_.head_dim());
  if (device_ == Device::CUDA)
    LOG(INFO) << "attention: " << attention_impl_name(attn_) << " (--attention="
              << attention_impl_name(cfg_.attention) << ", head dim " << cfg_.head_dim() << ")";
  LNS_CHECK(0 <= spec.first_layer && spec.first_layer <= spec.last_layer &&
            spec.last_layer <= cfg.num_layers);
  LNS_CHECK(num_slots >= 1 && B_ > 0 && T_ > 0);
  register_params();
  params_.finalize(device_);
  rope_cos_ = rope_.cos, rope_sin_ = rope_.sin;
  if (device_ != Device::CPU) {
    for (int i = 0; i < 2; ++i) {
      const Tensor host = i == 0 ? rope_.cos.t : rope_.sin.t;
      rope_dev_[i] = OwnedTensor(DType::F32, host.shape, device_);
      copy_tensor(rope_dev_[i], host);
    }
    rope_cos_ = rope_dev_[0], rope_sin_ = rope_dev_[1];
  }

  const int64_t N = B_ * T_, C = cfg_.hidden_size, F = fshard_.stored, QD = QD_, KD = KD_,
                V = vshard_.stored;
  // Activations in the device's activation dtype; statistics always f32.
  const auto act = [&](Shape s) { return OwnedTensor(act_, s, device_); };
  const auto f32 = [&](Shape s) { return OwnedTensor(DType::F32, s, device_); };
  const bool ln = cfg_.norm_type == NormType::LayerNorm;
  int num_stats = 0;
  for (auto& l : layers_)
    for (Layer* path : {&l, l.alt.get()})
      for (auto& s : path ? path->sub : l.sub)
        for (NormUse* n : {&s.pre, &s.out, &s.add})
          if (n->active()) num_stats = std::max(num_stats, n->stat + 1);
  ws_ = std::make_unique<Workspace>();
  ws_->mean.resize(6), ws_->rstd.resize(6);
  for (int i = 0; i < num_slots; ++i) {
    auto slot = std::make_unique<Slot>();
    if (spec_.has_embedding) slot->ids = OwnedTensor(DType::I32, Shape{B_, T_}, device_);
    slot->h0 = act({N, C});
    slot->mean.resize(num_stats + 1), slot->rstd.resize(num_stats + 1);  // +1: the final norm
    slot->layers.resize(layers_.size());
    for (size_t j = 0; j < layers_.size(); ++j) bind_layer_acts(static_cast<int>(j), *slot);
    if (spec_.has_head) {
      slot->kept.emplace_back(f32({N}));
      slot->rstd[num_stats] = slot->kept.back();
      if (ln) {
        slot->kept.emplace_back(f32({N}));
        slot->mean[num_stats] = slot->kept.back();
      }
      slot->hf = act({N, C});
      slot->logits = act({B_, T_, V});
      slot->targets = OwnedTensor(DType::I32, Shape{N}, device_);
      slot->losses = f32({N});
      if (device_ != Device::CPU) slot->losses_host = OwnedTensor(DType::F32, Shape{N});
      slot->rowmax = f32({N});
      slot->sumexp = f32({N});
      slot->target_logit = f32({N});
    }
    slots_.push_back(std::move(slot));
  }
  scratch_ = std::make_unique<Scratch>();
  Scratch& sc = *scratch_;
  sc.d_a = act({N, C}), sc.d_b = act({N, C}), sc.dr = act({N, C}), sc.df = act({N, C}),
  sc.du = act({N, C}), sc.dhf = act({N, C});
  sc.dq = act({N, QD}), sc.dctx = act({N, QD}), sc.dk = act({N, KD}), sc.dv = act({N, KD});  // local heads
  sc.dgate = act({N, F}), sc.dup = act({N, F}), sc.dact = act({N, F});
  for (const Layer& l : layers_)
    if (l.alt && sc.route_d[0].t.empty()) sc.route_d[0] = act({N, C}), sc.route_d[1] = act({N, C});
}

// Binds layer `local`'s activations in `slot` to buffers of the slot, or, for those
// its recompute mode drops, to the workspace's (lns/recompute.h). A full layer keeps
// only its output, the next layer's input (r, or y after an N_add); its input is the
// previous layer's kept output or h0.
void LlamaStage::bind_layer_acts(int local, Slot& slot) {
  const Layer& l = layers_[local];
  Slot::LayerActs& a = slot.layers[local];
  bind_path_acts(l, layer_recompute(cfg_.recompute, cfg_.recompute_layers, local), slot);
  if (!l.alt) return;
  // A routed block: path 1 in the same mode (the workspace serves both paths in turn,
  // block_backward recomputes each before its backward); gate and mix kept.
  a.alt = std::make_unique<Slot::LayerActs>();
  bind_path_acts(*l.alt, a.mode, slot);
  for (OwnedTensor* t : {&a.route_gate, &a.route_soft, &a.route_dgate, &a.route_noise, &a.route_zero})
    *t = OwnedTensor(DType::F32, Shape{B_, 2}, device_);
  a.route_out = OwnedTensor(act_, Shape{B_ * T_, cfg_.hidden_size}, device_);
}

// One path of a layer (the layer, or a routed block's twin): its activations by `mode`.
void LlamaStage::bind_path_acts(const Layer& l, RecomputeMode mode, Slot& slot) {
  Slot::LayerActs& a = l.is_alt ? *slot.layers[l.local].alt : slot.layers[l.local];
  Slot::LayerActs& w = ws_->acts;
  a.mode = mode;
  const bool full = a.mode == RecomputeMode::Full, none = a.mode == RecomputeMode::None;
  const int64_t N = B_ * T_, C = cfg_.hidden_size, F = fshard_.stored;
  auto bind = [&](Tensor& dst, Tensor& shared, DType dtype, Shape shape, bool keep) {
    if (keep) {
      slot.kept.emplace_back(dtype, shape, device_);
      dst = slot.kept.back();
      return;
    }
    if (shared.empty()) {  // first layer that needs this workspace buffer
      ws_->buffers.emplace_back(dtype, shape, device_);
      shared = ws_->buffers.back();
    }
    dst = shared;
  };
  for (int s = 0; s < 2; ++s) {
    const Sublayer& sl = l.sub[s];
    Slot::SubActs &x = a.sub[s], &wx = w.sub[s];
    if (sl.pre.active()) bind(x.u, wx.u, act_, {N, C}, !full);
    bind(x.f, wx.f, act_, {N, C}, !full);
    if (sl.out.active()) bind(x.f2, wx.f2, act_, {N, C}, !full);
    bind(x.r, wx.r, act_, {N, C}, !full || (s == 1 && !sl.add.active()));
    if (sl.add.active()) bind(x.y, wx.y, act_, {N, C}, !full || s == 1);
    const NormUse* uses[3] = {&sl.pre, &sl.out, &sl.add};
    for (int k = 0; k < 3; ++k) {
      if (!uses[k]->active()) continue;
      const int stat = uses[k]->stat;
      bind(slot.rstd[stat], ws_->rstd[3 * s + k], DType::F32, {N}, !full);
      if (cfg_.norm_type == NormType::LayerNorm)
        bind(slot.mean[stat], ws_->mean[3 * s + k], DType::F32, {N}, !full);
    }
  }
  bind(a.q, w.q, act_, {N, QD_}, !full);
  bind(a.k, w.k, act_, {N, KD_}, !full);
  bind(a.v, w.v, act_, {N, KD_}, !full);
  // The attention core and the SwiGLU product: what selective recomputes.
  bind(a.ctx, w.ctx, act_, {N, QD_}, none);
  bind(a.attn_saved, w.attn_saved, DType::F32, lns::attention_saved_shape(device_, B_, T_, Hq_), none);
  bind(a.gate, w.gate, act_, {N, F}, !full);
  bind(a.up, w.up, act_, {N, F}, !full);
  bind(a.act, w.act, act_, {N, F}, none);
}

void LlamaStage::register_params() {
  const int64_t C = cfg_.hidden_size, F = cfg_.intermediate_size,
                QD = int64_t{cfg_.num_heads} * cfg_.head_dim(), KD = cfg_.kv_dim(),
                V = cfg_.vocab_size;
  const bool ln = cfg_.norm_type == NormType::LayerNorm;
  ParamSet& p = params_;
  // Column-parallel weights split their rows (output features), row-parallel ones
  // their columns (input features); heads split evenly, FFN and vocabulary padded.
  const int r = tp_.rank;
  auto rows = [&](const std::string& name, int64_t out, int64_t in, ShardRange s, ParamKind k, int g) {
    return p.add_shard(name, {out, in}, 0, s, k, g);
  };
  auto cols = [&](const std::string& name, int64_t out, int64_t in, ShardRange s, ParamKind k, int g) {
    return p.add_shard(name, {out, in}, 1, s, k, g);
  };
  const ShardRange qs{r * QD_, QD_, QD_, QD_}, ks{r * KD_, KD_, KD_, KD_};
  if (spec_.has_embedding)
    embed_ = rows("model.embed_tokens.weight", V, C, vshard_, ParamKind::Embedding, -1);

  int next_stat = 0;
  for (int g = spec_.first_layer; g < spec_.last_layer; ++g) {
    Layer l;
    l.global = g;
    l.local = g - spec_.first_layer;
    l.first_param = p.size();
    l.plan = block_plan(cfg_, g);
    // Norms first, in the order the block owns them.
    std::vector<std::pair<NormSlot, std::pair<int, int>>> norms;
    for (NormSlot slot : l.plan.norms()) {
      const std::string base = layer_name(g, norm_slot_name(slot));
      const int gi = p.add(base + ".weight", {C}, ParamKind::NormGain, g);
      const int bi = ln ? p.add(base + ".bias", {C}, ParamKind::NormBias, g) : -1;
      norms.push_back({slot, {gi, bi}});
    }
    auto use = [&](const std::optional<NormSlot>& slot, float scale) {
      NormUse n;
      if (!slot) return n;
      for (auto& [s, gb] : norms)
        if (s == *slot) n.gain = gb.first, n.bias = gb.second;
      n.scale = scale;
      n.stat = next_stat++;
      return n;
    };
    if (l.plan.route) l.router = p.add(layer_name(g, "router.weight"), {2, C}, ParamKind::Router, g);
    const SublayerPlan* plans[2] = {&l.plan.attn, &l.plan.mlp};
    for (int w = 0; w < 2; ++w) {
      LNS_CHECK(!plans[w]->learnable_alpha || !plans[w]->add_norm) << "learned alpha on the pre-norm path only";
      if (plans[w]->learnable_alpha)
        l.res[w] = p.add(layer_name(g, w == 0 ? "self_attn.residual_scale" : "mlp.residual_scale"), {1},
                         ParamKind::ResidualScale, g);
    }
    const auto set_subs = [&](Layer& into, const SublayerPlan& attn, const SublayerPlan& mlp) {
      const SublayerPlan* ps[2] = {&attn, &mlp};
      for (int w = 0; w < 2; ++w) {
        LNS_CHECK(!ps[w]->learnable_alpha || ps[w] == plans[w]) << "learned alpha not on a routed path";
        into.sub[w].plan = *ps[w];
        into.sub[w].pre = use(ps[w]->pre_norm, ps[w]->pre_scale);
        into.sub[w].out = use(ps[w]->out_norm, 1.0f);
        into.sub[w].add = use(ps[w]->add_norm, 1.0f);
      }
    };
    set_subs(l, l.plan.attn, l.plan.mlp);
    if (l.plan.route) {
      l.alt = std::make_unique<Layer>();
      l.alt->is_alt = true;
      set_subs(*l.alt, l.plan.route->attn, l.plan.route->mlp);
    }
    l.wq = rows(layer_name(g, "self_attn.q_proj.weight"), QD, C, qs, ParamKind::Q, g);
    l.wk = rows(layer_name(g, "self_attn.k_proj.weight"), KD, C, ks, ParamKind::K, g);
    l.wv = rows(layer_name(g, "self_attn.v_proj.weight"), KD, C, ks, ParamKind::V, g);
    l.wo = cols(layer_name(g, "self_attn.o_proj.weight"), C, QD, qs, ParamKind::O, g);
    l.wg = rows(layer_name(g, "mlp.gate_proj.weight"), F, C, fshard_, ParamKind::Gate, g);
    l.wu = rows(layer_name(g, "mlp.up_proj.weight"), F, C, fshard_, ParamKind::Up, g);
    l.wd = cols(layer_name(g, "mlp.down_proj.weight"), C, F, fshard_, ParamKind::Down, g);
    if (l.alt) {  // the twin: everything but its sublayers is the layer's
      Layer& t = *l.alt;
      t.global = l.global, t.local = l.local, t.first_param = l.first_param, t.plan = l.plan;
      t.wq = l.wq, t.wk = l.wk, t.wv = l.wv, t.wo = l.wo, t.wg = l.wg, t.wu = l.wu, t.wd = l.wd;
    }
    layers_.push_back(std::move(l));
  }
  if (spec_.has_head) {
    final_gain_ = p.add("model.norm.weight", {C}, ParamKind::NormGain, -1);
    if (ln) final_bias_ = p.add("model.norm.bias", {C}, ParamKind::NormBias, -1);
    if (!cfg_.tie_embeddings) {
      head_ = rows("lm_head.weight", V, C, vshard_, ParamKind::LmHead, -1);
    } else if (embed_ >= 0) {
      head_ = embed_;
    } else {  // tied, but the embedding lives on the first stage: keep a copy here
      head_ = rows("model.embed_tokens.weight", V, C, vshard_, ParamKind::Embedding, -1);
      p.mutable_info(head_).tied_copy = true;
    }
  }
}

Tensor LlamaStage::layer_output(int local, const Slot& s) const {
  const Layer& l = layers_[local];
  if (l.alt) return s.layers[local].route_out;
  const Slot::SubActs& a = s.layers[local].sub[1];
  return l.sub[1].add.active() ? a.y : a.r;
}

auto& LlamaStage::acts(const Layer& l, Slot& s) {
  Slot::LayerActs& a = s.layers[l.local];
  return l.is_alt ? *a.alt : a;
}

void LlamaStage::set_gate_noise(uint64_t seed, uint64_t first_sample, int slot) {
  Slot& s = *slots_.at(slot);
  std::vector<float> g(2 * B_);
  for (const Layer& l : layers_) {
    if (!l.alt) continue;
    for (int64_t b = 0; b < B_; ++b)
      for (int k = 0; k < 2; ++k) g[b * 2 + k] = gate_noise(seed, l.global, first_sample + b, k);
    copy_tensor(s.layers[l.local].route_noise, Tensor{g.data(), DType::F32, Device::CPU, Shape{B_, 2}});
  }
  s.gate_noise = true;
}

void LlamaStage::set_gate_noise(int global_layer, const std::vector<float>& noise, int slot) {
  Slot& s = *slots_.at(slot);
  LNS_CHECK(global_layer >= spec_.first_layer && global_layer < spec_.last_layer &&
            layers_[global_layer - spec_.first_layer].alt && static_cast<int64_t>(noise.size()) == 2 * B_)
      << "layer " << global_layer << " is not a routed layer of this stage, or noise is not [B,2]";
  copy_tensor(s.layers[global_layer - spec_.first_layer].route_noise,
              Tensor{const_cast<float*>(noise.data()), DType::F32, Device::CPU, Shape{B_, 2}});
  s.gate_noise = true;
}

bool LlamaStage::has_routed_layers() const {
  for (const Layer& l : layers_)
    if (l.alt) return true;
  return false;
}

// A block: its two sublayers, or for a routed block both paths from the same input,
// mixed by the router's gate (lns/block_plan.h).
LlamaStage::Stream LlamaStage::block_forward(Layer& l, Slot& s, Stream x) {
  if (!l.alt) return sublayer_forward(l, 1, s, sublayer_forward(l, 0, s, x));
  settle(x);
  Slot::LayerActs& a = acts(l, s);
  const Tensor in = x.x;
  route_gate_forward(a.route_gate, a.route_soft, in.view({B_, T_, cfg_.hidden_size}), params_.param(l.router),
                     s.gate_noise ? a.route_noise : a.route_zero);
  Layer* paths[2] = {&l, l.alt.get()};
  for (int p = 0; p < 2; ++p) {
    Stream y = sublayer_forward(*paths[p], 1, s, sublayer_forward(*paths[p], 0, s, Stream{in}));
    settle(y);
    a.route_path[p] = y.x;
  }
  route_mix_forward(a.route_out, a.route_path[0], a.route_path[1], a.route_gate);
  return Stream{a.route_out};
}

// Under --recompute=full, a path's forward again from its kept input `in`, into the
// workspace, just before its backward. Its output is not needed (a pre-norm path's
// stays pending; an N_add rewrites the kept y with the same values), only what its
// backward reads. A no-op in the other modes.
void LlamaStage::recompute_path(Layer& path, Slot& s, Tensor in) {
  if (acts(path, s).mode != RecomputeMode::Full) return;
  sublayer_forward(path, 1, s, sublayer_forward(path, 0, s, Stream{in}));
}

// dy: gradient of the block's output, overwritten with that of its input; dx scratch.
void LlamaStage::block_backward(Layer& l, Slot& s, Tensor dy, Tensor dx) {
  if (!l.alt) {
    recompute_path(l, s, acts(l, s).sub[0].x);
    sublayer_backward(l, 1, s, dy, dx);
    sublayer_backward(l, 0, s, dx, dy);
    return;
  }
  Scratch& sc = *scratch_;
  Slot::LayerActs& a = acts(l, s);
  const Tensor d0 = sc.route_d[0], d1 = sc.route_d[1];
  route_mix_backward(d0, d1, a.route_dgate, dy, a.route_path[0], a.route_path[1], a.route_gate);
  recompute_path(l, s, a.sub[0].x);
  sublayer_backward(l, 1, s, d0, dx);  // path 0 into dy
  sublayer_backward(l, 0, s, dx, dy);
  recompute_path(*l.alt, s, a.sub[0].x);
  sublayer_backward(*l.alt, 1, s, d1, dx);  // path 1 into d0
  sublayer_backward(*l.alt, 0, s, dx, d0);
  axpby(dy, 1.0f, d0, 1.0f);
  const Tensor in = a.sub[0].x;
  route_gate_backward(dy.view({B_, T_, cfg_.hidden_size}), params_.grad(l.router), a.route_dgate, a.route_soft,
                      in.view({B_, T_, cfg_.hidden_size}), params_.param(l.router));
}

Tensor LlamaStage::forward_skipping(int global_layer, int slot) {
  LNS_CHECK(spec_.has_embedding && spec_.has_head) << "the sweep's reuse needs one stage";
  Slot& s = *slots_.at(slot);
  const int k = global_layer - spec_.first_layer;
  // The input to block k of the intact pass: block k-1's output, or the embedding.
  Stream x{k == 0 ? Tensor(s.h0) : layer_output(k - 1, s)};
  for (size_t j = k + 1; j < layers_.size(); ++j) x = block_forward(layers_[j], s, x);
  return head_forward(s, x);
}

std::vector<LlamaStage::LayerStats> LlamaStage::layer_stats(int slot) const {
  const Slot& s = *slots_.at(slot);
  const int64_t N = B_ * T_, C = cfg_.hidden_size;
  std::vector<LayerStats> out;
  for (size_t i = 0; i < layers_.size(); ++i) {
    LayerStats st;
    st.layer = layers_[i].global;
    const std::vector<float> in_h = to_host_f32(s.layers[i].sub[0].x),
                             o_h = to_host_f32(layer_output(static_cast<int>(i), s));
    const float *in = in_h.data(), *o = o_h.data();
    for (int64_t n = 0; n < N; ++n) {
      double dot = 0, nin = 0, nout = 0;
      for (int64_t c = 0; c < C; ++c) {
        const double a = in[n * C + c], b = o[n * C + c];
        dot += a * b, nin += a * a, nout += b * b;
        st.sum += b;
      }
      st.sum_sq += nout;
      st.norm += std::sqrt(nout);
      const double cosv = nin > 0 && nout > 0 ? std::clamp(dot / std::sqrt(nin * nout), -1.0, 1.0) : 1.0;
      const double ang = std::acos(cosv) / M_PI;
      st.angle += ang;
      if (n % T_ == T_ - 1) st.angle_last += ang, st.sequences += 1;
    }
    st.tokens = N;
    st.elements = double(N) * C;
    out.push_back(st);
  }
  return out;
}

void LlamaStage::set_skipped_layers(const std::vector<int>& global_layers) {
  skipped_.assign(layers_.size(), false);
  for (int g : global_layers)
    if (g >= spec_.first_layer && g < spec_.last_layer) skipped_[g - spec_.first_layer] = true;
}

void LlamaStage::init_weights(uint64_t seed) {
  for (int i = 0; i < params_.size(); ++i) {
    const ParamInfo& info = params_.info(i);
    float* w = params_.host_param(i).f32();
    const int64_t n = info.shape.numel();
    if (info.kind == ParamKind::NormGain || info.kind == ParamKind::NormBias ||
        info.kind == ParamKind::ResidualScale) {
      const float v = info.kind == ParamKind::NormBias ? 0.0f : 1.0f;
      for (int64_t j = 0; j < n; ++j) w[j] = v;
      continue;
    }
    // Each element draws the number its logical index draws on a single rank;
    // tensor-parallel padding is zero.
    const float std = init_std_for(cfg_, info.kind, info.logical[0], info.logical[1]);
    const uint64_t key = rng_key(seed, info.name);
    const int64_t cols = info.shape[1], lcols = info.logical[1];
    for (int64_t j = 0; j < n; ++j) {
      int64_t li, lj;
      w[j] = info.to_logical(j / cols, j % cols, &li, &lj) ? std * normal_at(key, li * lcols + lj) : 0.0f;
    }
  }
  params_.upload();
}

void LlamaStage::set_fixed_divisor(int global_layer, int which, float pos0, float rest) {
  LNS_REQUIRE(pos0 > 0.0f && rest > 0.0f && std::isfinite(pos0) && std::isfinite(rest),
              "--ln_free: fixed divisors must be finite and > 0, got ", pos0, " and ", rest);
  if (global_layer == cfg_.num_layers && spec_.has_head) {
    final_fixed_[0] = pos0, final_fixed_[1] = rest;
    return;
  }
  NormUse* n = nullptr;
  {
    LNS_REQUIRE(global_layer >= spec_.first_layer && global_layer < spec_.last_layer &&
                    (which == 0 || which == 1),
                "--ln_free: layer ", global_layer, " sublayer ", which, " is not on this stage");
    n = &layers_[global_layer - spec_.first_layer].sub[which].pre;
    LNS_REQUIRE(n->active(), "--ln_free: layer ", global_layer, " sublayer ", which,
                " has no pre-norm in scheme ", norm_scheme_name(cfg_.norm_scheme));
  }
  n->fixed0 = pos0, n->fixed = rest;
}

void LlamaStage::add_divisor_sums(std::vector<std::array<double, 4>>& sums, int slot) const {
  const Slot& s = *slots_.at(slot);
  // A full layer's second sublayer input lives in the recompute workspace, overwritten.
  LNS_REQUIRE(cfg_.recompute != RecomputeMode::Full,
              "--ln_free calibration needs --recompute=none or selective, not full");
  const size_t n = 2 * layers_.size() + (spec_.has_head ? 1 : 0);
  if (sums.size() < n) sums.resize(n, {0.0, 0.0, 0.0, 0.0});
  for (size_t j = 0; j < layers_.size(); ++j)
    for (int w = 0; w < 2; ++w)
      if (layers_[j].sub[w].pre.active())
        norm_divisor_sums(cfg_.norm_type, s.layers[j].sub[w].x, T_, cfg_.norm_eps,
                          sums[2 * j + w].data());
  if (spec_.has_head) norm_divisor_sums(cfg_.norm_type, s.out, T_, cfg_.norm_eps, sums[n - 1].data());
}

void LlamaStage::norm_fwd(const NormUse& n, Slot& s, Tensor out, Tensor x) {
  const Tensor bias = n.bias >= 0 ? params_.param(n.bias) : Tensor{};
  const Tensor mean = cfg_.norm_type == NormType::LayerNorm ? s.mean[n.stat] : Tensor{};
  if (n.fixed > 0.0f)
    return norm_forward_fixed(cfg_.norm_type, out, mean, s.rstd[n.stat], x,
                              params_.param(n.gain), bias, n.scale,
                              FixedDivisor{n.fixed0, n.fixed, T_});
  norm_forward(cfg_.norm_type, out, mean, s.rstd[n.stat], x, params_.param(n.gain), bias, n.scale,
               cfg_.norm_eps);
}

void LlamaStage::norm_bwd(const NormUse& n, Slot& s, Tensor dx, Tensor dres, Tensor dout, Tensor x) {
  const Tensor dbias = n.bias >= 0 ? params_.grad(n.bias) : Tensor{};
  const Tensor mean = cfg_.norm_type == NormType::LayerNorm ? s.mean[n.stat] : Tensor{};
  if (n.fixed > 0.0f)
    return norm_backward_fixed(cfg_.norm_type, dx, params_.grad(n.gain), dbias, dres, dout, x,
                               mean, s.rstd[n.stat], params_.param(n.gain), n.scale);
  norm_backward(cfg_.norm_type, dx, params_.grad(n.gain), dbias, dres, dout, x, mean,
                s.rstd[n.stat], params_.param(n.gain), n.scale);
}

void LlamaStage::settle(Stream& st) {
  if (!st.pending()) return;
  copy(st.x, st.base);
  axpby(st.x, st.alpha, st.delta, 1.0f);
  st.base = st.delta = Tensor{};
}

// out = N(x), settling a pending add in the same pass.
void LlamaStage::stream_norm_fwd(const NormUse& n, Slot& s, Tensor out, Stream& st) {
  if (!st.pending() || n.fixed > 0.0f) {  // a fixed divisor (LN-free) has no fused add
    settle(st);
    norm_fwd(n, s, out, st.x);
    return;
  }
  const Tensor bias = n.bias >= 0 ? params_.param(n.bias) : Tensor{};
  const Tensor mean = cfg_.norm_type == NormType::LayerNorm ? s.mean[n.stat] : Tensor{};
  residual_norm_forward(cfg_.norm_type, st.x, out, mean, s.rstd[n.stat], st.base, st.delta, st.alpha,
                        params_.param(n.gain), bias, n.scale, cfg_.norm_eps);
  st.base = st.delta = Tensor{};
}

// u = s*N_pre(x); f = F(u); f2 = N_out(f); r = alpha*x + f2; y = N_add(r). Returns y,
// or r still pending when no N_add follows (the next norm adds it).
LlamaStage::Stream LlamaStage::sublayer_forward(Layer& l, int w, Slot& s, Stream in) {
  const Sublayer& sl = l.sub[w];
  Slot::SubActs& a = acts(l, s).sub[w];
  const Tensor x = in.x;
  a.x = x;
  Tensor u = x;
  if (sl.pre.active()) {
    stream_norm_fwd(sl.pre, s, a.u, in);
    u = a.u;
  } else {
    settle(in);
  }
  if (w == 0)
    attention_fwd(l, s, u, a.f);
  else
    mlp_fwd(l, s, u, a.f);
  Tensor f2 = a.f;
  if (sl.out.active()) {
    norm_fwd(sl.out, s, a.f2, a.f);
    f2 = a.f2;
  }
  const float alpha = sl.plan.residual_alpha;
  if (sl.add.active()) {
    const NormUse& n = sl.add;
    const Tensor bias = n.bias >= 0 ? params_.param(n.bias) : Tensor{};
    const Tensor mean = cfg_.norm_type == NormType::LayerNorm ? s.mean[n.stat] : Tensor{};
    residual_norm_forward(cfg_.norm_type, a.r, a.y, mean, s.rstd[n.stat], x, f2, alpha,
                          params_.param(n.gain), bias, n.scale, cfg_.norm_eps);
    return Stream{a.y};
  }
  if (l.res[w] >= 0) {  // scale_res_pre_norm: r = a*x + f2 with a learned a, done here
    scaled_residual_forward(a.r, x, f2, params_.param(l.res[w]));
    return Stream{a.r};
  }
  return Stream{a.r, x, f2, alpha};
}

// dy: gradient of the sublayer output y; writes dx, the gradient of its input x.
void LlamaStage::sublayer_backward(Layer& l, int w, Slot& s, Tensor dy, Tensor dx) {
  const Sublayer& sl = l.sub[w];
  Slot::SubActs& a = acts(l, s).sub[w];
  Scratch& sc = *scratch_;
  Tensor dr = dy;
  if (sl.add.active()) {
    norm_bwd(sl.add, s, sc.dr, {}, dy, a.r);
    dr = sc.dr;
  }
  Tensor df = dr;
  if (sl.out.active()) {
    norm_bwd(sl.out, s, sc.df, {}, dr, a.f);
    df = sc.df;
  }
  if (w == 0)
    attention_bwd(l, s, df, sc.du);
  else
    mlp_bwd(l, s, df, sc.du);
  // dx = alpha * dr + d(u)/d(x) . du
  const float alpha = sl.plan.residual_alpha;
  if (l.res[w] >= 0)  // d(alpha) += sum(dr * x), then dr *= alpha in place
    scaled_residual_backward(dr, params_.grad(l.res[w]), dr, a.x, params_.param(l.res[w]));
  else if (alpha != 1.0f)
    axpby(dr, alpha, dr, 0.0f);  // dr is consumed above; scale in place
  if (sl.pre.active()) {
    norm_bwd(sl.pre, s, dx, dr, sc.du, a.x);
  } else {
    copy(dx, dr);
    axpby(dx, 1.0f, sc.du, 1.0f);
  }
}

void LlamaStage::attention_fwd(Layer& l, Slot& s, Tensor u, Tensor f) {
  Slot::LayerActs& a = acts(l, s);
  const int64_t D = cfg_.head_dim();
  const Shape qs{B_, T_, Hq_, D}, ks{B_, T_, Hkv_, D};  // this rank's heads
  linear_forward(a.q, u, params_.compute(l.wq));  // [N, Hq*D]
  linear_forward(a.k, u, params_.compute(l.wk));  // [N, Hkv*D]
  linear_forward(a.v, u, params_.compute(l.wv));  // [N, Hkv*D]
  rope_forward(a.q.view(qs), rope_cos_, rope_sin_);
  rope_forward(a.k.view(ks), rope_cos_, rope_sin_);
  attention_forward(a.ctx.view(qs), a.attn_saved, a.q.view(qs), a.k.view(ks), a.v.view(ks), attn_);
  linear_forward(f, a.ctx, params_.compute(l.wo));  // [N, C], partial over tp (row-parallel)
  tp_.all_reduce_sum(f);
}

void LlamaStage::attention_bwd(Layer& l, Slot& s, Tensor df, Tensor du) {
  Slot::LayerActs& a = acts(l, s);
  const Slot::SubActs& sa = a.sub[0];
  const Tensor u = l.sub[0].pre.active() ? sa.u : sa.x;
  Scratch& sc = *scratch_;
  const int64_t D = cfg_.head_dim();
  const Shape qs{B_, T_, Hq_, D}, ks{B_, T_, Hkv_, D};
  if (a.mode == RecomputeMode::Selective)  // the attention core again, from the kept q, k, v
    attention_forward(a.ctx.view(qs), a.attn_saved, a.q.view(qs), a.k.view(ks), a.v.view(ks), attn_);
  linear_backward(sc.dctx, params_.grad(l.wo), df, a.ctx, params_.compute(l.wo), false);
  attention_backward(sc.dq.t.view(qs), sc.dk.t.view(ks), sc.dv.t.view(ks), sc.dctx.t.view(qs),
                     a.attn_saved, a.q.view(qs), a.k.view(ks), a.v.view(ks), a.ctx.view(qs), attn_);
  rope_backward(sc.dq.t.view(qs), rope_cos_, rope_sin_);
  rope_backward(sc.dk.t.view(ks), rope_cos_, rope_sin_);
  linear_backward(du, params_.grad(l.wq), sc.dq, u, params_.compute(l.wq), false);
  linear_backward(du, params_.grad(l.wk), sc.dk, u, params_.compute(l.wk), true);
  linear_backward(du, params_.grad(l.wv), sc.dv, u, params_.compute(l.wv), true);
  tp_.all_reduce_sum(du);  // column-parallel q/k/v: input gradient summed over tp
}

void LlamaStage::mlp_fwd(Layer& l, Slot& s, Tensor u, Tensor f) {
  Slot::LayerActs& a = acts(l, s);
  linear_forward(a.gate, u, params_.compute(l.wg));  // [N, F]
  linear_forward(a.up, u, params_.compute(l.wu));    // [N, F]
  swiglu_forward(a.act, a.gate, a.up);             // [N, F]
  linear_forward(f, a.act, params_.compute(l.wd));   // [N, C], partial over tp (row-parallel)
  tp_.all_reduce_sum(f);
}

void LlamaStage::mlp_bwd(Layer& l, Slot& s, Tensor df, Tensor du) {
  Slot::LayerActs& a = acts(l, s);
  const Slot::SubActs& sa = a.sub[1];
  const Tensor u = l.sub[1].pre.active() ? sa.u : sa.x;
  Scratch& sc = *scratch_;
  if (a.mode == RecomputeMode::Selective) swiglu_forward(a.act, a.gate, a.up);  // [N, F] again
  linear_backward(sc.dact, params_.grad(l.wd), df, a.act, params_.compute(l.wd), false);
  swiglu_backward(sc.dgate, sc.dup, sc.dact, a.gate, a.up);
  linear_backward(du, params_.grad(l.wg), sc.dgate, u, params_.compute(l.wg), false);
  linear_backward(du, params_.grad(l.wu), sc.dup, u, params_.compute(l.wu), true);
  tp_.all_reduce_sum(du);  // column-parallel gate/up: input gradient summed over tp
}

Tensor LlamaStage::forward(Tensor input, int slot) {
  Slot& s = *slots_.at(slot);
  const int64_t N = B_ * T_, C = cfg_.hidden_size;
  if (spec_.has_embedding) {
    LNS_CHECK(input.dtype == DType::I32 && input.numel() == N) << "first stage takes ids [B,T]";
    copy(s.ids, input);
    // The real rows only: ids past them belong to the next rank (the stored padding).
    embedding_forward(s.h0, s.ids, params_.compute(embed_).rows(0, vshard_.valid), vshard_.begin);
    tp_.all_reduce_sum(s.h0);  // vocab-parallel: each row comes from one rank
  } else {
    LNS_CHECK(input.dtype == act_ && input.numel() == N * C) << "stage takes hidden [B,T,C]";
    copy(s.h0, input);
  }
  Stream x{s.h0};
  for (Layer& l : layers_) {
    if (!skipped_.empty() && skipped_[&l - layers_.data()]) continue;
    x = block_forward(l, s, x);
  }
  s.gate_noise = false;  // noise is for one forward: evaluation runs without
  if (!spec_.has_head) {
    settle(x);
    s.out = x.x.view({B_, T_, C});
    return s.out;
  }
  return head_forward(s, x);
}

Tensor LlamaStage::head_forward(Slot& s, Stream x) {
  const int64_t N = B_ * T_;
  NormUse fin{final_gain_, final_bias_, 1.0f, static_cast<int>(s.rstd.size()) - 1,
              final_fixed_[0], final_fixed_[1]};
  stream_norm_fwd(fin, s, s.hf, x);
  linear_forward(s.logits.t.view({N, vshard_.stored}), s.hf, params_.compute(head_));
  s.out = x.x;  // the input of the final norm, kept for its backward
  return s.logits;
}

double LlamaStage::loss(Tensor targets, int slot) {
  Slot& s = *slots_.at(slot);
  loss_tokens(targets, slot);
  const float* host = s.losses.f32();
  if (device_ != Device::CPU) {  // one copy into a buffer kept with the slot
    copy_tensor(s.losses_host, s.losses);
    host = s.losses_host.f32();
  }
  double sum = 0.0;
  for (int64_t n = 0; n < B_ * T_; ++n) sum += host[n];  // in token order: deterministic
  return sum;
}

Tensor LlamaStage::loss_tokens(Tensor targets, int slot) {
  Slot& s = *slots_.at(slot);
  LNS_CHECK(spec_.has_head && targets.dtype == DType::I32 && targets.numel() == B_ * T_);
  copy(s.targets, targets.view(s.targets.t.shape));
  targets = s.targets;
  s.loss_pending = true;
  // Vocab-parallel cross-entropy: no rank holds the full logits.
  const Tensor logits = s.logits.t.view({B_ * T_, vshard_.stored});
  vocab_row_max(s.rowmax, logits, vshard_.valid);
  tp_.all_reduce_max(s.rowmax);
  vocab_sumexp_target(s.sumexp, s.target_logit, logits, s.rowmax, targets, vshard_.begin,
                      vshard_.valid);
  tp_.all_reduce_sum(s.sumexp);
  tp_.all_reduce_sum(s.target_logit);
  cross_entropy_combine(s.losses, s.rowmax, s.sumexp, s.target_logit, targets);
  return s.losses;
}

Tensor LlamaStage::losses(int slot) const { return slots_.at(slot)->losses; }

Tensor LlamaStage::backward(Tensor dout, float grad_scale, int slot) {
  Slot& s = *slots_.at(slot);
  Scratch& sc = *scratch_;
  const int64_t N = B_ * T_, C = cfg_.hidden_size;
  Tensor dy = sc.d_a.t.view({N, C}), dx = sc.d_b.t.view({N, C});
  if (spec_.has_head) {
    LNS_CHECK(s.loss_pending) << "loss() must run before backward() on the last stage";
    const Tensor dlogits = s.logits.t.view({N, vshard_.stored});
    vocab_cross_entropy_backward(dlogits, dlogits, s.rowmax, s.sumexp, s.targets, vshard_.begin,
                                 vshard_.valid, grad_scale);
    linear_backward(sc.dhf, params_.grad(head_), dlogits, s.hf, params_.compute(head_), false);
    tp_.all_reduce_sum(sc.dhf);  // column-parallel head: input gradient summed over tp
    NormUse fin{final_gain_, final_bias_, 1.0f, static_cast<int>(s.rstd.size()) - 1,
              final_fixed_[0], final_fixed_[1]};
    norm_bwd(fin, s, dy, {}, sc.dhf, s.out);
    if (grad_ready_) grad_ready_(params_.info(final_gain_).offset);
  } else {
    LNS_CHECK(dout.numel() == N * C);
    copy(dy, dout);
  }
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) {
    if (!skipped_.empty() && skipped_[&*it - layers_.data()]) continue;
    block_backward(*it, s, dy, dx);
    if (grad_ready_) grad_ready_(params_.info(it->first_param).offset);
  }
  if (spec_.has_embedding) {
    embedding_backward(params_.grad(embed_).rows(0, vshard_.valid), s.ids, dy, vshard_.begin);
    if (grad_ready_) grad_ready_(0);
    return {};
  }
  return dy.view({B_, T_, C});
}

}  // namespace lns
