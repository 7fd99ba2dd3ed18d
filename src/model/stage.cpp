#include "lns/model/stage.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <glog/logging.h>

#include "lns/core/device.h"
#include "lns/core/errors.h"
#include "lns/model/fp8_state.h"
#include "lns/core/ops.h"
#include "lns/core/rng.h"
#include "stage_types.h"

namespace lns {
namespace {

void copy(Tensor dst, Tensor src) { copy_tensor(dst, src); }

}  // namespace

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
    : LlamaStage(cfg, spec, micro_batch, seq_len, std::vector<int>(spec.num_chunks(), num_slots), tp, device) {}

LlamaStage::LlamaStage(const LlamaConfig& cfg, StageSpec spec, int64_t micro_batch, int64_t seq_len,
                       const std::vector<int>& chunk_slots, TensorParallel tp, Device device)
    : cfg_(cfg), spec_(spec), B_(micro_batch), T_(seq_len), tp_(tp),
      rope_(seq_len, cfg.head_dim(), cfg.rope_theta), device_(device),
      act_(lns::activation_dtype(device)) {
  cfg_.validate();
  init_dims();
  attn_ = choose_attention_impl(cfg_.attention, device_, cfg_.head_dim());
  if (device_ == Device::CUDA) {
    const std::string lib = attention_library(attn_);
    LOG(INFO) << "attention: " << attention_impl_name(attn_) << (lib.empty() ? "" : ", " + lib) << " (--attention="
              << attention_impl_name(cfg_.attention) << ", head dim " << cfg_.head_dim() << ")";
  }
  for (const auto& [first, last] : spec.chunk_ranges())
    LNS_CHECK(0 <= first && first <= last && last <= cfg.num_layers);
  LNS_CHECK(static_cast<int>(chunk_slots.size()) == spec.num_chunks() && B_ > 0 && T_ > 0);
  for (int n : chunk_slots) LNS_CHECK(n >= 1);
  register_params();
  params_.finalize(device_);
  if (cfg_.fp8 != Fp8Mode::None) {
    if (device_ == Device::CUDA) {  // cuBLASLt's FP8 matmul: every GEMM dimension a multiple of 16
      const std::pair<int64_t, const char*> dims[] = {
          {B_ * T_, "the tokens of a micro-batch (--micro_batch_size x --seq_len)"},
          {cfg_.hidden_size, "--hidden_size"},
          {QD_, "the query width of a tensor-parallel rank (--num_heads x head dim / --tp)"},
          {KD_, "the key/value width of a tensor-parallel rank (--num_kv_heads x head dim / --tp)"}};
      for (const auto& [v, what] : dims)
        LNS_REQUIRE(v % 16 == 0, "--fp8=", fp8_mode_name(cfg_.fp8), " on CUDA needs ", what,
                    " to be a multiple of 16 (cuBLASLt's FP8 GEMMs), got ", v);
    }
    // Every block's linears in kFp8BlockLinears order (the LM head stays as it is); q, k
    // and v read one input, gate and up another: each group casts it once (x_from).
    std::vector<int> weights, x_from;
    for (const Layer& l : layers_)
      for (const int w : {l.wq, l.wk, l.wv, l.wo, l.wg, l.wu, l.wd}) {
        weights.push_back(w);
        x_from.push_back(w == l.wk || w == l.wv ? l.wq : w == l.wu ? l.wg : w);
      }
    fp8_ = std::make_unique<Fp8State>(params_, weights, cfg_.fp8, cfg_.fp8_scaling, device_, x_from);
  }
  rope_cos_ = rope_.cos, rope_sin_ = rope_.sin;
  if (device_ != Device::CPU) {
    for (int i = 0; i < 2; ++i) {
      const Tensor host = i == 0 ? rope_.cos.t : rope_.sin.t;
      rope_dev_[i] = OwnedTensor(DType::F32, host.shape, device_);
      copy_tensor(rope_dev_[i], host);
    }
    rope_cos_ = rope_dev_[0], rope_sin_ = rope_dev_[1];
  }

  plan_buffers(chunk_slots);
}

Tensor LlamaStage::layer_output(int local, const Slot& s) const {
  const Layer& l = layers_[local];
  if (l.alt) return s.layers[local - s.first_local].route_out;
  const Slot::SubActs& a = s.layers[local - s.first_local].sub[1];
  return l.sub[1].add.active() ? a.y : a.r;
}

LlamaStage::Slot& LlamaStage::slot_at(int i, int chunk) const {
  LNS_CHECK(chunk >= 0 && chunk < num_chunks()) << "chunk " << chunk << " of " << num_chunks();
  return *slots_[chunk].at(i);
}

int LlamaStage::local_of(int global_layer) const {
  for (size_t j = 0; j < layers_.size(); ++j)
    if (layers_[j].global == global_layer) return static_cast<int>(j);
  return -1;
}

auto& LlamaStage::acts(const Layer& l, Slot& s) {
  Slot::LayerActs& a = s.layers[l.local - s.first_local];
  return l.is_alt ? *a.alt : a;
}

void LlamaStage::set_gate_noise(uint64_t seed, uint64_t first_sample, int slot, int chunk) {
  Slot& s = slot_at(slot, chunk);
  std::vector<float> g(2 * B_);
  for (int j = chunk_begin_[chunk]; j < chunk_begin_[chunk + 1]; ++j) {
    const Layer& l = layers_[j];
    if (!l.alt) continue;
    for (int64_t b = 0; b < B_; ++b)
      for (int k = 0; k < 2; ++k) g[b * 2 + k] = gate_noise(seed, l.global, first_sample + b, k);
    copy_tensor(acts(l, s).route_noise, Tensor{g.data(), DType::F32, Device::CPU, Shape{B_, 2}});
  }
  s.gate_noise = true;
}

void LlamaStage::set_gate_noise(int global_layer, const std::vector<float>& noise, int slot) {
  const int j = local_of(global_layer);
  LNS_CHECK(j >= 0 && layers_[j].alt && static_cast<int64_t>(noise.size()) == 2 * B_)
      << "layer " << global_layer << " is not a routed layer of this stage, or noise is not [B,2]";
  int chunk = 0;
  while (j >= chunk_begin_[chunk + 1]) ++chunk;
  Slot& s = slot_at(slot, chunk);
  copy_tensor(acts(layers_[j], s).route_noise,
              Tensor{const_cast<float*>(noise.data()), DType::F32, Device::CPU, Shape{B_, 2}});
  s.gate_noise = true;
}

bool LlamaStage::has_routed_layers() const {
  for (const Layer& l : layers_)
    if (l.alt) return true;
  return false;
}

// A block: its two sublayers, or for a routed block both paths from the same input,
// mixed by the router's gate (lns/model/block_plan.h).
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
  LNS_CHECK(spec_.has_embedding && spec_.has_head && num_chunks() == 1) << "the sweep's reuse needs one stage";
  Slot& s = slot_at(slot, 0);
  const int k = global_layer - spec_.first_layer;
  // The input to block k of the intact pass: block k-1's output, or the embedding.
  Stream x{k == 0 ? Tensor(s.h0) : layer_output(k - 1, s)};
  for (size_t j = k + 1; j < layers_.size(); ++j) x = block_forward(layers_[j], s, x);
  return head_forward(s, x);
}

std::vector<LlamaStage::LayerStats> LlamaStage::layer_stats(int slot) const {
  // This rank's tokens (all of them, or its share under sequence parallelism);
  // n0 + n is the token's index in the micro-batch.
  const int64_t N = NL_, n0 = tp_.token_shard(B_ * T_).begin, C = cfg_.hidden_size;
  std::vector<LayerStats> out;
  int chunk = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    while (static_cast<int>(i) >= chunk_begin_[chunk + 1]) ++chunk;
    const Slot& s = slot_at(slot, chunk);
    LayerStats st;
    st.layer = layers_[i].global;
    const std::vector<float> in_h = to_host_f32(s.layers[i - s.first_local].sub[0].x),
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
      if ((n0 + n) % T_ == T_ - 1) st.angle_last += ang, st.sequences += 1;
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
    if (const int j = local_of(g); j >= 0) skipped_[j] = true;
}

LlamaStage::NormUse LlamaStage::final_use() const {
  NormUse n{final_gain_, final_bias_, 1.0f, final_stat_, final_fixed_[0], final_fixed_[1]};
  n.eot = final_eot_;
  return n;
}

void LlamaStage::set_fixed_divisor(int global_layer, int which, float pos0, float rest) {
  if (global_layer == cfg_.num_layers) return set_fixed_divisor(global_layer, DivisorSlot::Final, pos0, rest);
  LNS_REQUIRE(which == 0 || which == 1, "--ln_free: sublayer ", which, " is not 0 (attention) or 1 (MLP)");
  if (which == 1) return set_fixed_divisor(global_layer, DivisorSlot::Mlp, pos0, rest);
  set_fixed_divisor(global_layer, DivisorSlot::AttnQK, pos0, rest);
  set_fixed_divisor(global_layer, DivisorSlot::AttnV, pos0, rest);
}

void LlamaStage::set_fixed_divisor(int global_layer, DivisorSlot slot, float pos0, float rest,
                                   int32_t eot_token) {
  LNS_REQUIRE(pos0 > 0.0f && rest > 0.0f && std::isfinite(pos0) && std::isfinite(rest),
              "--ln_free: fixed divisors must be finite and > 0, got ", pos0, " and ", rest);
  if (slot == DivisorSlot::Final) {
    LNS_REQUIRE(!cfg_.folded_norms, "--ln_free: the model's norms are folded into its linears (folded_norms); ",
                "there is no final norm left to fix");
    LNS_REQUIRE(global_layer == cfg_.num_layers && spec_.has_head, "--ln_free: the final norm (layer ",
                global_layer, ") is not on this stage");
    final_fixed_[0] = pos0, final_fixed_[1] = rest;
    final_eot_ = eot_token;
    return;
  }
  const int j = local_of(global_layer);  // chunks: a stage's layers need not be contiguous
  LNS_REQUIRE(j >= 0, "--ln_free: layer ", global_layer, " ", divisor_slot_name(slot), " is not on this stage");
  Layer& l = layers_[j];
  Sublayer& sl = l.sub[slot == DivisorSlot::Mlp ? 1 : 0];
  LNS_REQUIRE(sl.pre.active(), "--ln_free: layer ", global_layer, " ", divisor_slot_name(slot),
              ": that sublayer has no pre-norm in scheme ", norm_scheme_name(l.plan.effective));
  NormUse* n = &sl.pre;
  if (slot == DivisorSlot::AttnV) {
    if (!sl.pre_v.active()) split_value_norm(l);
    n = &sl.pre_v;
  } else if (slot == DivisorSlot::AttnQK && !sl.pre_v.active() &&
             (sl.pre.fixed0 != pos0 || sl.pre.fixed != rest || sl.pre.eot != eot_token)) {
    split_value_norm(l);  // v keeps what it had; only q/k change
  }
  n->fixed0 = pos0, n->fixed = rest, n->eot = eot_token;
}

// From now on v reads its own normalised copy of the attention input (same gain, bias
// and scale, its own divisor). Allocated here, once, never in the hot loop.
void LlamaStage::split_value_norm(Layer& l) {
  Sublayer& sl = l.sub[0];
  sl.pre_v = sl.pre;
  sl.pre_v.stat = -1;
  if (fp8_) fp8_->split_input(l.wv);  // v's input is no longer q's and k's
  const int64_t N = NL_, C = cfg_.hidden_size;  // the split region's rows (this rank's share)
  for (auto& chunk : slots_)
  for (auto& slot : chunk) {
    // Statistics in every slot (all slots keep the same stat numbering); the copy only in
    // the slots of l's chunk (--virtual_stages: a slot holds its own chunk's layers).
    // Kept with the slot in every recompute mode (outside the activation account).
    sl.pre_v.stat = static_cast<int>(slot->rstd.size());
    slot->kept.emplace_back(DType::F32, Shape{N}, device_);
    slot->mean.push_back(slot->kept.back());
    slot->kept.emplace_back(DType::F32, Shape{N}, device_);
    slot->rstd.push_back(slot->kept.back());
    const int j = l.local - slot->first_local;
    if (j >= 0 && j < static_cast<int>(slot->layers.size()))
      acts(l, *slot).sub[0].uv = OwnedTensor(act_, Shape{N, C}, device_);
  }
  if (scratch_ && scratch_->du_v.t.empty()) scratch_->du_v = OwnedTensor(act_, Shape{N, C}, device_);
}

bool LlamaStage::needs_token_ids() const {
  if (final_eot_ >= 0 && final_fixed_[1] > 0.0f) return true;
  for (const Layer& l : layers_)
    for (const Sublayer& sl : l.sub)
      for (const NormUse* n : {&sl.pre, &sl.pre_v})
        if (n->active() && n->fixed > 0.0f && n->eot >= 0) return true;
  return false;
}

void LlamaStage::set_token_ids(Tensor ids, int slot, int chunk) {
  LNS_CHECK(ids.dtype == DType::I32 && ids.numel() == B_ * T_) << "token ids [B,T] i32";
  Slot& s = slot_at(slot, chunk);
  copy(s.ids, ids.view(s.ids.t.shape));
}

void LlamaStage::add_divisor_sums(DivisorSums& sums, int slot) const {
  // A full layer's second sublayer input lives in the recompute workspace, overwritten.
  LNS_REQUIRE(cfg_.recompute != RecomputeMode::Full,
              "--ln_free calibration needs --recompute=none or selective, not full");
  const size_t n = 2 * size_t(cfg_.num_layers) + 1;
  if (sums.size() < n) sums.resize(n, {0.0, 0.0, 0.0, 0.0});
  const int64_t row0 = tp_.token_shard(B_ * T_).begin;  // the norms see this rank's rows
  for (int c = 0; c < num_chunks(); ++c) {
    const Slot& s = slot_at(slot, c);  // a slot holds its chunk's layers
    for (int j = chunk_begin_[c]; j < chunk_begin_[c + 1]; ++j)
      for (int w = 0; w < 2; ++w)
        if (layers_[j].sub[w].pre.active())
          norm_divisor_sums(cfg_.norm_type, s.layers[j - s.first_local].sub[w].x, T_, cfg_.norm_eps,
                            sums[divisor_sums_index(layers_[j].global, w == 1 ? DivisorSlot::Mlp : DivisorSlot::AttnQK)].data(),
                            row0);
  }
  if (spec_.has_head)
    norm_divisor_sums(cfg_.norm_type, slot_at(slot, num_chunks() - 1).out, T_, cfg_.norm_eps,
                      sums[divisor_sums_index(cfg_.num_layers, DivisorSlot::Final)].data(), row0);
}

// The boundaries of the tensor-parallel region. Without sequence parallelism every
// rank holds all N tokens: gathering is the identity and a partial result is summed
// in place. With it, the split regions hold N/tp tokens: the region's input is
// gathered into a full buffer and its partial output reduce-scattered out of one.
Tensor LlamaStage::gather_tokens(Tensor local) {
  if (!tp_.sequence_parallel) return local;
  // The one gathered input alive at a time (full_a); full_b holds partial outputs.
  Tensor full = scratch_->full_a.t.view({B_ * T_, cfg_.hidden_size});
  tp_.all_gather(full, local);
  return full;
}

Tensor LlamaStage::partial_out(Tensor local) {
  return tp_.sequence_parallel ? scratch_->full_b.t.view({B_ * T_, cfg_.hidden_size}) : local;
}

void LlamaStage::reduce_tokens(Tensor local) {
  if (tp_.sequence_parallel)
    tp_.reduce_scatter(local, scratch_->full_b.t.view({B_ * T_, cfg_.hidden_size}));
  else
    tp_.all_reduce_sum(local);
}

void LlamaStage::norm_fwd(const NormUse& n, Slot& s, Tensor out, Tensor x) {
  const Tensor bias = n.bias >= 0 ? params_.param(n.bias) : Tensor{};
  const Tensor mean = cfg_.norm_type == NormType::LayerNorm ? s.mean[n.stat] : Tensor{};
  if (n.fixed > 0.0f) {
    // x holds this rank's rows of the micro-batch (a share under --sequence_parallel).
    const ShardRange rows = tp_.token_shard(B_ * T_);
    const Tensor ids = n.eot >= 0 ? s.ids.t.view({B_ * T_}).rows(rows.begin, rows.begin + NL_) : Tensor{};
    return norm_forward_fixed(cfg_.norm_type, out, mean, s.rstd[n.stat], x, params_.param(n.gain), bias, n.scale,
                              FixedDivisor{n.fixed0, n.fixed, T_, n.eot, ids, rows.begin});
  }
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
  Tensor uv;  // v's input: u, or its own copy when the attention pre-norm is split
  if (sl.pre.active()) {
    stream_norm_fwd(sl.pre, s, a.u, in);
    u = uv = a.u;
    if (sl.pre_v.active()) {
      norm_fwd(sl.pre_v, s, a.uv, x);  // x is settled now
      uv = a.uv;
    }
  } else {
    settle(in);
    uv = u;
  }
  if (w == 0)
    attention_fwd(l, s, u, uv, a.f);
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
  if (l.res[w] >= 0) {  // scale_res_pre_norm: r = x + b*f2 with a learned b, done here
    scaled_residual_forward(a.r, f2, x, params_.param(l.res[w]));  // the op's r = a*x + f, x <- f2
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
  if (l.res[w] >= 0) {  // r = x + b*f2: d(b) += sum(dr * f2), d(f2) = b * dr (no N_out here); dr kept for x
    scaled_residual_backward(sc.df, params_.grad(l.res[w]), dr, a.f, params_.param(l.res[w]));
    df = sc.df;
  }
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
  if (alpha != 1.0f)
    axpby(dr, alpha, dr, 0.0f);  // dr is consumed above; scale in place
  if (sl.pre.active()) {
    norm_bwd(sl.pre, s, dx, dr, sc.du, a.x);
    if (sl.pre_v.active()) norm_bwd(sl.pre_v, s, dx, dx, sc.du_v, a.x);  // dx += v's path
  } else {
    copy(dx, dr);
    axpby(dx, 1.0f, sc.du, 1.0f);
  }
}

std::vector<Fp8Linear> LlamaStage::fp8_linears(const std::vector<int>& ws) const {
  std::vector<Fp8Linear> fs;
  for (const int w : ws) fs.push_back(fp8_->linear(w));
  return fs;
}

// A block's linears that read one input x: ys[i][N,out_i] = x @ ws[i]^T, in FP8 under
// --fp8 (lns/core/fp8_linear.h), where each run of them that Fp8State gives one x row casts x
// once (the shared ops).
void LlamaStage::lin_fwd(const std::vector<int>& ws, const std::vector<Tensor>& ys, Tensor x) {
  LNS_CHECK(ws.size() == ys.size());
  if (!fp8_) {
    for (size_t i = 0; i < ws.size(); ++i) linear_forward(ys[i], x, params_.compute(ws[i]));
    return;
  }
  const std::vector<Fp8Linear> fs = fp8_linears(ws);
  for (size_t b = 0, e; b < ws.size(); b = e) {
    std::vector<Tensor> gy, gw;
    for (e = b; e < ws.size() && fs[e].x == fs[b].x; ++e) gy.push_back(ys[e]), gw.push_back(params_.compute(ws[e]));
    linear_forward_fp8_shared(gy, x, gw, {fs.begin() + long(b), fs.begin() + long(e)});
  }
}

// Their backward: dx (+)= sum_i dys[i] @ ws[i], grad(ws[i]) += dys[i]^T @ x.
void LlamaStage::lin_bwd(const std::vector<int>& ws, Tensor dx, const std::vector<Tensor>& dys, Tensor x,
                         bool accumulate_dx) {
  LNS_CHECK(ws.size() == dys.size());
  if (!fp8_) {
    for (size_t i = 0; i < ws.size(); ++i)
      linear_backward(dx, params_.grad(ws[i]), dys[i], x, params_.compute(ws[i]), accumulate_dx || i > 0);
    return;
  }
  const std::vector<Fp8Linear> fs = fp8_linears(ws);
  for (size_t b = 0, e; b < ws.size(); b = e) {
    std::vector<Tensor> gdw, gdy, gw;
    for (e = b; e < ws.size() && fs[e].x == fs[b].x; ++e)
      gdw.push_back(params_.grad(ws[e])), gdy.push_back(dys[e]), gw.push_back(params_.compute(ws[e]));
    linear_backward_fp8_shared(dx, gdw, gdy, x, gw, accumulate_dx || b > 0,
                               {fs.begin() + long(b), fs.begin() + long(e)});
  }
}

void LlamaStage::attention_fwd(Layer& l, Slot& s, Tensor u, Tensor uv, Tensor f) {
  Slot::LayerActs& a = acts(l, s);
  const int64_t D = cfg_.head_dim();
  const Shape qs{B_, T_, Hq_, D}, ks{B_, T_, Hkv_, D};  // this rank's heads
  const bool own_v = uv.data != u.data;           // LN-free: v reads its own normalised copy
  u = gather_tokens(u);                           // [N, C]
  if (own_v) {
    lin_fwd({l.wq, l.wk}, {a.q, a.k}, u);             // [N, Hq*D], [N, Hkv*D]
    lin_fwd({l.wv}, {a.v}, gather_tokens(uv));        // [N, Hkv*D] (reuses u's gather buffer)
  } else {
    lin_fwd({l.wq, l.wk, l.wv}, {a.q, a.k, a.v}, u);  // [N, Hq*D], [N, Hkv*D], [N, Hkv*D]
  }
  rope_forward(a.q.view(qs), rope_cos_, rope_sin_);
  rope_forward(a.k.view(ks), rope_cos_, rope_sin_);
  attention_forward(a.ctx.view(qs), a.attn_saved, a.q.view(qs), a.k.view(ks), a.v.view(ks), attn_);
  lin_fwd({l.wo}, {partial_out(f)}, a.ctx);  // [N, C], partial over tp (row-parallel)
  reduce_tokens(f);
}

void LlamaStage::attention_bwd(Layer& l, Slot& s, Tensor df, Tensor du) {
  Slot::LayerActs& a = acts(l, s);
  const Slot::SubActs& sa = a.sub[0];
  const Tensor u = l.sub[0].pre.active() ? sa.u : sa.x;
  Scratch& sc = *scratch_;
  const int64_t D = cfg_.head_dim();
  const Shape qs{B_, T_, Hq_, D}, ks{B_, T_, Hkv_, D};
  df = gather_tokens(df);  // [N, C]
  if (a.mode == RecomputeMode::Selective)  // the attention core again, from the kept q, k, v
    attention_forward(a.ctx.view(qs), a.attn_saved, a.q.view(qs), a.k.view(ks), a.v.view(ks), attn_);
  lin_bwd({l.wo}, sc.dctx, {df}, a.ctx, false);
  attention_backward(sc.dq.t.view(qs), sc.dk.t.view(ks), sc.dv.t.view(ks), sc.dctx.t.view(qs),
                     a.attn_saved, a.q.view(qs), a.k.view(ks), a.v.view(ks), a.ctx.view(qs), attn_);
  rope_backward(sc.dq.t.view(qs), rope_cos_, rope_sin_);
  rope_backward(sc.dk.t.view(ks), rope_cos_, rope_sin_);
  const Tensor ug = gather_tokens(u), dug = partial_out(du);  // gathered again: not kept since forward
  const bool own_v = l.sub[0].pre_v.active();  // LN-free: v read its own normalised copy
  if (own_v)
    lin_bwd({l.wq, l.wk}, dug, {sc.dq, sc.dk}, ug, false);
  else
    lin_bwd({l.wq, l.wk, l.wv}, dug, {sc.dq, sc.dk, sc.dv}, ug, false);
  reduce_tokens(du);  // column-parallel q/k/v: input gradient summed over tp
  if (own_v) {        // v's input gradient apart, through the same gather/reduce buffers
    const Tensor uvg = gather_tokens(sa.uv), duvg = partial_out(sc.du_v);
    lin_bwd({l.wv}, duvg, {sc.dv}, uvg, false);
    reduce_tokens(sc.du_v);
  }
}

void LlamaStage::mlp_fwd(Layer& l, Slot& s, Tensor u, Tensor f) {
  Slot::LayerActs& a = acts(l, s);
  u = gather_tokens(u);                              // [N, C]
  lin_fwd({l.wg, l.wu}, {a.gate, a.up}, u);     // [N, F] each
  swiglu_forward(a.act, a.gate, a.up);             // [N, F]
  lin_fwd({l.wd}, {partial_out(f)}, a.act);  // [N, C], partial over tp (row-parallel)
  reduce_tokens(f);
}

void LlamaStage::mlp_bwd(Layer& l, Slot& s, Tensor df, Tensor du) {
  Slot::LayerActs& a = acts(l, s);
  const Slot::SubActs& sa = a.sub[1];
  const Tensor u = l.sub[1].pre.active() ? sa.u : sa.x;
  Scratch& sc = *scratch_;
  df = gather_tokens(df);  // [N, C]
  if (a.mode == RecomputeMode::Selective) swiglu_forward(a.act, a.gate, a.up);  // [N, F] again
  lin_bwd({l.wd}, sc.dact, {df}, a.act, false);
  swiglu_backward(sc.dgate, sc.dup, sc.dact, a.gate, a.up);
  const Tensor ug = gather_tokens(u), dug = partial_out(du);  // gathered again: not kept since forward
  lin_bwd({l.wg, l.wu}, dug, {sc.dgate, sc.dup}, ug, false);
  reduce_tokens(du);  // column-parallel gate/up: input gradient summed over tp
}

Tensor LlamaStage::forward(Tensor input, int slot, int chunk) {
  Slot& s = slot_at(slot, chunk);
  const int64_t N = B_ * T_, C = cfg_.hidden_size;
  const bool embeds = spec_.has_embedding && chunk == 0, heads = spec_.has_head && chunk == num_chunks() - 1;
  if (embeds) {
    LNS_CHECK(input.dtype == DType::I32 && input.numel() == N) << "first stage takes ids [B,T]";
    copy(s.ids, input);
    // The real rows only: ids past them belong to the next rank (the stored padding).
    embedding_forward(partial_out(s.h0), s.ids, params_.compute(embed_).rows(0, vshard_.valid),
                      vshard_.begin);  // [N, C]
    reduce_tokens(s.h0);  // vocab-parallel: each row comes from one rank
  } else {
    LNS_CHECK(input.dtype == act_ && input.numel() == NL_ * C) << "stage takes hidden [B,T,C] (its tokens)";
    copy(s.h0, input);
  }
  Stream x{s.h0};
  for (int j = chunk_begin_[chunk]; j < chunk_begin_[chunk + 1]; ++j) {
    if (!skipped_.empty() && skipped_[j]) continue;
    x = block_forward(layers_[j], s, x);
  }
  s.gate_noise = false;  // noise is for one forward: evaluation runs without
  if (!heads) {
    settle(x);
    s.out = tp_.sequence_parallel ? x.x.view({NL_, C}) : x.x.view({B_, T_, C});
    return s.out;
  }
  return head_forward(s, x);
}

Tensor LlamaStage::head_forward(Slot& s, Stream x) {
  const int64_t N = B_ * T_;
  if (cfg_.folded_norms) {  // no final norm: the head reads the residual stream
    settle(x);
    copy(s.hf, x.x);
  } else {
    stream_norm_fwd(final_use(), s, s.hf, x);
  }
  linear_forward(s.logits.t.view({N, vshard_.stored}), gather_tokens(s.hf), params_.compute(head_));
  s.out = x.x;  // the input of the final norm, kept for its backward
  return s.logits;
}

double LlamaStage::loss(Tensor targets, int slot) {
  Slot& s = slot_at(slot, num_chunks() - 1);
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
  Slot& s = slot_at(slot, num_chunks() - 1);
  LNS_CHECK(spec_.has_head && targets.dtype == DType::I32 && targets.numel() == B_ * T_);
  copy(s.targets, targets.view(s.targets.t.shape));
  targets = s.targets;
  s.loss_pending = true;
  // Vocab-parallel cross-entropy: no rank holds the full logits.
  const Tensor logits = s.logits.t.view({B_ * T_, vshard_.stored});
  // One read of the logits: each rank's max and sum relative to it, then the sum taken
  // to the max over the ranks (a factor of exactly 1 at tp = 1).
  vocab_max_sumexp_target(s.local_max, s.sumexp, s.target_logit, logits, targets, vshard_.begin, vshard_.valid);
  copy(s.rowmax, s.local_max);
  tp_.all_reduce_max(s.rowmax);
  vocab_sumexp_rescale(s.sumexp, s.local_max, s.rowmax);
  tp_.all_reduce_sum(s.sumexp);
  tp_.all_reduce_sum(s.target_logit);
  cross_entropy_combine(s.losses, s.rowmax, s.sumexp, s.target_logit, targets);
  return s.losses;
}

Tensor LlamaStage::losses(int slot) const { return slot_at(slot, num_chunks() - 1).losses; }

Tensor LlamaStage::backward(Tensor dout, float grad_scale, int slot, int chunk) {
  Slot& s = slot_at(slot, chunk);
  Scratch& sc = *scratch_;
  const int64_t N = B_ * T_, C = cfg_.hidden_size;
  const bool embeds = spec_.has_embedding && chunk == 0, heads = spec_.has_head && chunk == num_chunks() - 1;
  Tensor dy = sc.d_a.t.view({NL_, C}), dx = sc.d_b.t.view({NL_, C});
  if (heads) {
    LNS_CHECK(s.loss_pending) << "loss() must run before backward() on the last stage";
    const Tensor dlogits = s.logits.t.view({N, vshard_.stored});
    vocab_cross_entropy_backward(dlogits, dlogits, s.rowmax, s.sumexp, s.targets, vshard_.begin,
                                 vshard_.valid, grad_scale);
    linear_backward(partial_out(sc.dhf), params_.grad(head_), dlogits, gather_tokens(s.hf), params_.compute(head_),
                    false);
    reduce_tokens(sc.dhf);  // column-parallel head: input gradient summed over tp
    if (cfg_.folded_norms) {
      copy(dy, sc.dhf);
      if (grad_ready_) grad_ready_(params_.info(head_).offset);
    } else {
      norm_bwd(final_use(), s, dy, {}, sc.dhf, s.out);
      if (grad_ready_) grad_ready_(params_.info(final_gain_).offset);
    }
  } else {
    LNS_CHECK(dout.numel() == NL_ * C);
    copy(dy, dout);
  }
  for (int j = chunk_begin_[chunk + 1] - 1; j >= chunk_begin_[chunk]; --j) {
    if (!skipped_.empty() && skipped_[j]) continue;
    block_backward(layers_[j], s, dy, dx);
    if (grad_ready_) grad_ready_(params_.info(layers_[j].first_param).offset);
  }
  if (embeds) {
    embedding_backward(params_.grad(embed_).rows(0, vshard_.valid), s.ids, gather_tokens(dy), vshard_.begin);
    if (grad_ready_) grad_ready_(0);
    return {};
  }
  return tp_.sequence_parallel ? dy : dy.view({B_, T_, C});
}

}  // namespace lns
