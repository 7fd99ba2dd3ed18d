// LlamaStage's activation buffers (lns/model/stage.h): the micro-batch slots each chunk
// keeps in flight, the workspace that recomputing layers share, and backward's scratch
// gradients, all planned once at construction (nothing is allocated in the hot loop).
// Which buffers a layer keeps is its recompute mode's (lns/model/recompute.h).
#include <algorithm>

#include "lns/core/errors.h"
#include "lns/core/ops.h"
#include "stage_types.h"

namespace lns {

void LlamaStage::plan_buffers(const std::vector<int>& chunk_slots) {
  const int64_t N = B_ * T_, C = cfg_.hidden_size, F = fshard_.stored, QD = QD_, KD = KD_,
                V = vshard_.stored;
  // NL: tokens of the split regions (norms, residual stream): N / tp under sequence
  // parallelism, N otherwise. The tensor-parallel region (q/k/v, attention, FFN) and
  // the logits always hold all N tokens.
  LNS_CHECK(!tp_.sequence_parallel || N % tp_.size == 0) << "Layout::check_sequence_length must refuse this";
  // A routed block's gate reads whole sequences ([B,T,C]), which a rank's share of
  // the tokens is not.
  // Asked of the whole model, not this stage, so that every rank refuses alike.
  bool routed = false;
  for (int g = 0; g < cfg_.num_layers; ++g) routed = routed || block_plan(cfg_, g).route.has_value();
  LNS_REQUIRE(!tp_.sequence_parallel || !routed,
              "--sequence_parallel does not run routed blocks (--norm_scheme=routed, mono, mono_reverse, "
              "mono_reverse_corrected or routed in --layer_schemes); drop one of them");
  NL_ = tp_.token_shard(N).size;
  const int64_t NL = NL_;
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
  final_stat_ = num_stats;  // the final norm's (allocated where the head is)
  ws_ = std::make_unique<Workspace>();
  ws_->mean.resize(6), ws_->rstd.resize(6);
  // A slot of chunk c holds the activations of chunk c's layers only.
  slots_.resize(chunk_slots.size());
  std::vector<int> slot_chunks;  // the chunk of every slot, in order
  for (int c = 0; c < num_chunks(); ++c) slot_chunks.insert(slot_chunks.end(), chunk_slots[c], c);
  for (const int c : slot_chunks) {
    const bool heads = spec_.has_head && c == num_chunks() - 1;
    auto slot = std::make_unique<Slot>();
    slot->first_local = chunk_begin_[c];
    slot->ids = OwnedTensor(DType::I32, Shape{B_, T_}, device_);  // every stage: LN-free end-of-text rows
    slot->h0 = act({NL, C});
    slot->mean.resize(num_stats + 1), slot->rstd.resize(num_stats + 1);  // +1: the final norm's
    slot->layers.resize(chunk_begin_[c + 1] - chunk_begin_[c]);
    for (int j = chunk_begin_[c]; j < chunk_begin_[c + 1]; ++j) bind_layer_acts(j, *slot);
    if (heads) {
      slot->kept.emplace_back(f32({NL}));
      slot->rstd[num_stats] = slot->kept.back();
      if (ln) {
        slot->kept.emplace_back(f32({NL}));
        slot->mean[num_stats] = slot->kept.back();
      }
      slot->hf = act({NL, C});
      slot->logits = act({B_, T_, V});
      slot->targets = OwnedTensor(DType::I32, Shape{N}, device_);
      slot->losses = f32({N});
      if (device_ != Device::CPU) slot->losses_host = OwnedTensor(DType::F32, Shape{N});
      slot->rowmax = f32({N});
      slot->local_max = f32({N});
      slot->sumexp = f32({N});
      slot->target_logit = f32({N});
    }
    slots_[c].push_back(std::move(slot));
  }
  scratch_ = std::make_unique<Scratch>();
  Scratch& sc = *scratch_;
  sc.d_a = act({NL, C}), sc.d_b = act({NL, C}), sc.dr = act({NL, C}), sc.df = act({NL, C}),
  sc.du = act({NL, C}), sc.dhf = act({NL, C});
  if (tp_.sequence_parallel) sc.full_a = act({N, C}), sc.full_b = act({N, C});
  sc.dq = act({N, QD}), sc.dctx = act({N, QD}), sc.dk = act({N, KD}), sc.dv = act({N, KD});  // local heads
  sc.dgate = act({N, F}), sc.dup = act({N, F}), sc.dact = act({N, F});
  for (const Layer& l : layers_)
    if (l.alt && sc.route_d[0].t.empty()) sc.route_d[0] = act({N, C}), sc.route_d[1] = act({N, C});
}

// Binds layer `local`'s activations in `slot` to buffers of the slot, or, for those
// its recompute mode drops, to the workspace's (lns/model/recompute.h). A full layer keeps
// only its output, the next layer's input (r, or y after an N_add); its input is the
// previous layer's kept output or h0.
void LlamaStage::bind_layer_acts(int local, Slot& slot) {
  const Layer& l = layers_[local];
  Slot::LayerActs& a = slot.layers[local - slot.first_local];
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
  Slot::LayerActs& own = slot.layers[l.local - slot.first_local];  // a slot holds its chunk's layers
  Slot::LayerActs& a = l.is_alt ? *own.alt : own;
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
    // The split regions (norms, residual stream) hold the rank's NL tokens (N / tp under
    // --sequence_parallel); the tensor-parallel interiors below all N.
    if (sl.pre.active()) bind(x.u, wx.u, act_, {NL_, C}, !full);
    bind(x.f, wx.f, act_, {NL_, C}, !full);
    if (sl.out.active()) bind(x.f2, wx.f2, act_, {NL_, C}, !full);
    bind(x.r, wx.r, act_, {NL_, C}, !full || (s == 1 && !sl.add.active()));
    if (sl.add.active()) bind(x.y, wx.y, act_, {NL_, C}, !full || s == 1);
    const NormUse* uses[3] = {&sl.pre, &sl.out, &sl.add};
    for (int k = 0; k < 3; ++k) {
      if (!uses[k]->active()) continue;
      const int stat = uses[k]->stat;
      bind(slot.rstd[stat], ws_->rstd[3 * s + k], DType::F32, {NL_}, !full);
      if (cfg_.norm_type == NormType::LayerNorm)
        bind(slot.mean[stat], ws_->mean[3 * s + k], DType::F32, {NL_}, !full);
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

}  // namespace lns
