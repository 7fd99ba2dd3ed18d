// LlamaStage's decode path (lns/model/stage.h: start_decode, decode): the blocks of forward()
// run on a few new positions at a time against a key/value cache, for generation. The
// sublayer is the general form of lns/model/block_plan.h, read from the same Layer and NormUse
// values forward() reads, so every scheme, LN-free divisor and folded model decodes as
// it trains; only the attention core differs (attention_decode over the cache instead
// of attention_forward over the sequence). tests/unit/test_generate.cpp holds it against
// forward() on whole sequences, scheme by scheme.
#include <algorithm>

#include "lns/core/device.h"
#include "lns/core/errors.h"
#include "lns/core/ops.h"
#include "stage_types.h"

namespace lns {

void LlamaStage::start_decode(int64_t max_len, int64_t chunk) {
  LNS_CHECK(spec_.has_embedding && spec_.has_head && num_chunks() == 1 && tp_.size == 1)
      << "decoding needs the whole model on one rank";
  LNS_REQUIRE(max_len > 0 && chunk > 0, "decoding needs a positive length, got ", max_len);
  for (const Layer& l : layers_)
    LNS_REQUIRE(!l.alt, "layer ", l.global, " is a routed block (", norm_scheme_name(cfg_.norm_scheme),
                "): its gate reads the mean over the whole sequence, future tokens included, so it cannot be "
                "decoded token by token");
  const int64_t D = cfg_.head_dim();
  LNS_REQUIRE(device_ != Device::CUDA || D <= 256, "decoding on CUDA takes head dims up to 256, got ", D);
  chunk = std::min(chunk, max_len);
  const int64_t C = cfg_.hidden_size, F = fshard_.stored, V = vshard_.stored;
  auto d = std::make_unique<DecodeState>();
  d->max_len = max_len, d->chunk = chunk;
  const auto act = [&](Shape s) { return OwnedTensor(act_, s, device_); };
  const auto f32 = [&](Shape s) { return OwnedTensor(DType::F32, s, device_); };
  for (size_t j = 0; j < layers_.size(); ++j) {
    d->k.push_back(act({max_len, Hkv_, D}));
    d->v.push_back(act({max_len, Hkv_, D}));
  }
  d->rope = std::make_unique<RopeTable>(max_len, D, cfg_.rope_theta);
  d->cos = d->rope->cos, d->sin = d->rope->sin;
  if (device_ != Device::CPU) {
    for (int i = 0; i < 2; ++i) {
      const Tensor host = i == 0 ? d->rope->cos.t : d->rope->sin.t;
      d->rope_dev[i] = OwnedTensor(DType::F32, host.shape, device_);
      copy_tensor(d->rope_dev[i], host);
    }
    d->cos = d->rope_dev[0], d->sin = d->rope_dev[1];
  }
  d->ids = OwnedTensor(DType::I32, Shape{chunk}, device_);
  d->x[0] = act({chunk, C}), d->x[1] = act({chunk, C});
  d->u = act({chunk, C}), d->f = act({chunk, C}), d->f2 = act({chunk, C}), d->hf = act({chunk, C});
  d->uv = act({chunk, C});
  d->q = act({chunk, QD_}), d->ctx = act({chunk, QD_});
  d->gate = act({chunk, F}), d->up = act({chunk, F}), d->act = act({chunk, F});
  d->scores = f32({chunk, Hq_, max_len});
  d->mean = f32({chunk}), d->rstd = f32({chunk});
  d->logits = act({chunk, V});
  dec_ = std::move(d);
}

int64_t LlamaStage::decode_capacity() const { return dec_ ? dec_->max_len : 0; }

// out[n,C] = N(x[n,C]) for the rows at positions pos..pos+n-1: the live norm, or an
// LN-free one's constant divisors (position 0 and end-of-text rows divide by pos0). The
// sequence is one: position t is row t of it, so the table's period is max_len.
void LlamaStage::decode_norm(const NormUse& n, Tensor out, Tensor x, int64_t pos) {
  const int64_t rows = x.dim(0);
  const Tensor bias = n.bias >= 0 ? params_.param(n.bias) : Tensor{};
  const Tensor mean = cfg_.norm_type == NormType::LayerNorm ? dec_->mean.t.rows(0, rows) : Tensor{};
  const Tensor rstd = dec_->rstd.t.rows(0, rows);
  if (n.fixed > 0.0f) {
    const Tensor ids = n.eot >= 0 ? dec_->ids.t.rows(0, rows) : Tensor{};
    return norm_forward_fixed(cfg_.norm_type, out, mean, rstd, x, params_.param(n.gain), bias, n.scale,
                              FixedDivisor{n.fixed0, n.fixed, dec_->max_len, n.eot, ids, pos});
  }
  norm_forward(cfg_.norm_type, out, mean, rstd, x, params_.param(n.gain), bias, n.scale, cfg_.norm_eps);
}

// One sublayer on x[n,C] (lns/model/block_plan.h's form; sublayer_forward's arithmetic):
//   u = s*N_pre(x); f = F(u); f2 = N_out(f); r = alpha*x + f2 (or x + b*f2); y = N_add(r).
// r goes to `spare`, y over x. Returns the tensor that holds the output (y or r).
Tensor LlamaStage::decode_sublayer(const Layer& l, int w, Tensor x, Tensor spare, int64_t pos) {
  DecodeState& d = *dec_;
  const Sublayer& sl = l.sub[w];
  const int64_t n = x.dim(0), D = cfg_.head_dim();
  Tensor u = x, uv = x;
  if (sl.pre.active()) {
    u = uv = d.u.t.rows(0, n);
    decode_norm(sl.pre, u, x, pos);
    if (sl.pre_v.active()) {  // LN-free: v normalised with its own divisor
      uv = d.uv.t.rows(0, n);
      decode_norm(sl.pre_v, uv, x, pos);
    }
  }
  const Tensor f = d.f.t.rows(0, n);
  if (w == 0) {
    const int j = l.local;
    const Tensor q = d.q.t.rows(0, n);                                           // [n, Hq*D]
    const Tensor k = d.k[j].t.view({d.max_len, KD_}).rows(pos, pos + n);       // [n, Hkv*D] in the cache
    const Tensor v = d.v[j].t.view({d.max_len, KD_}).rows(pos, pos + n);
    linear_forward(q, u, params_.compute(l.wq));
    linear_forward(k, u, params_.compute(l.wk));
    linear_forward(v, uv, params_.compute(l.wv));
    // Rows pos..pos+n-1 of the tables: row t of the views is position pos + t.
    const Tensor cos = d.cos.rows(pos, pos + n), sin = d.sin.rows(pos, pos + n);
    rope_forward(q.view({1, n, Hq_, D}), cos, sin);
    rope_forward(k.view({1, n, Hkv_, D}), cos, sin);
    const Tensor ctx = d.ctx.t.rows(0, n);
    attention_decode(ctx.view({n, Hq_, D}), d.scores.t.rows(0, n), q.view({n, Hq_, D}), d.k[j], d.v[j], pos);
    linear_forward(f, ctx, params_.compute(l.wo));
  } else {
    const Tensor gate = d.gate.t.rows(0, n), up = d.up.t.rows(0, n), a = d.act.t.rows(0, n);
    linear_forward(gate, u, params_.compute(l.wg));
    linear_forward(up, u, params_.compute(l.wu));
    swiglu_forward(a, gate, up);
    linear_forward(f, a, params_.compute(l.wd));
  }
  Tensor f2 = f;
  if (sl.out.active()) {
    f2 = d.f2.t.rows(0, n);
    decode_norm(sl.out, f2, f, pos);
  }
  if (l.res[w] >= 0) {
    scaled_residual_forward(spare, f2, x, params_.param(l.res[w]));  // r = b*f2 + x
  } else {
    copy_tensor(spare, x);
    axpby(spare, sl.plan.residual_alpha, f2, 1.0f);  // r = alpha*x + f2
  }
  if (!sl.add.active()) return spare;
  decode_norm(sl.add, x, spare, pos);  // y = N_add(r), over x (read by nothing after)
  return x;
}

// Tokens ids[0..n) at positions pos..pos+n-1 (n <= chunk): keys and values into the
// cache, logits [n, vocab_size] (host, row-major) into logits_rows.
void LlamaStage::decode_chunk(const int32_t* ids, int64_t n, int64_t pos, float* logits_rows) {
  DecodeState& d = *dec_;
  const int64_t V = cfg_.vocab_size;
  const Tensor idt = d.ids.t.rows(0, n);
  copy_tensor(idt, Tensor{const_cast<int32_t*>(ids), DType::I32, Device::CPU, Shape{n}});
  Tensor x = d.x[0].t.rows(0, n), spare = d.x[1].t.rows(0, n);
  embedding_forward(x, idt, params_.compute(embed_).rows(0, vshard_.valid), vshard_.begin);  // [n, C]
  for (size_t j = 0; j < layers_.size(); ++j) {
    if (!skipped_.empty() && skipped_[j]) continue;
    for (int w = 0; w < 2; ++w) {
      const Tensor out = decode_sublayer(layers_[j], w, x, spare, pos);
      if (out.data != x.data) std::swap(x, spare);
    }
  }
  const Tensor hf = d.hf.t.rows(0, n);
  if (cfg_.folded_norms)
    copy_tensor(hf, x);  // no final norm: the head reads the residual stream
  else
    decode_norm(final_use(), hf, x, pos);
  const Tensor logits = d.logits.t.rows(0, n);  // [n, V stored]
  linear_forward(logits, hf, params_.compute(head_));
  const std::vector<float> host = to_host_f32(logits);
  const int64_t stored = vshard_.stored;
  for (int64_t i = 0; i < n; ++i) std::copy_n(host.data() + i * stored, V, logits_rows + i * V);
}

std::vector<float> LlamaStage::decode(const std::vector<int32_t>& ids, int64_t pos, std::vector<float>* all_logits) {
  LNS_CHECK(dec_) << "start_decode() first";
  const int64_t n = static_cast<int64_t>(ids.size()), V = cfg_.vocab_size;
  LNS_REQUIRE(n > 0, "decode: no tokens given");
  LNS_REQUIRE(pos >= 0 && pos + n <= dec_->max_len, "decode: positions ", pos, "..", pos + n - 1,
              " do not fit the cache of ", dec_->max_len, " positions");
  for (const int32_t t : ids)
    LNS_REQUIRE(t >= 0 && t < V, "decode: token id ", t, " is outside the vocabulary [0, ", V, ")");
  std::vector<float> rows(n * V);
  for (int64_t b = 0; b < n; b += dec_->chunk) {
    const int64_t m = std::min(dec_->chunk, n - b);
    decode_chunk(ids.data() + b, m, pos + b, rows.data() + b * V);
  }
  std::vector<float> last(rows.end() - V, rows.end());
  if (all_logits) *all_logits = std::move(rows);
  return last;
}

}  // namespace lns
