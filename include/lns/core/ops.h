// The op set: explicit forward/backward pairs, no autograd. Each op is declared once,
// here, and its declaration is its dispatch on the device of its tensors: the backends
// register an implementation per device (CPU kernels in src/cpu/, CUDA kernels in
// src/cuda/; lns/core/op_table.h). On the CPU every tensor is f32 (ids/targets i32). On CUDA the
// activations ([N,C], [N,F], q/k/v, logits) and GEMM weights are bf16; norm gains and
// biases, statistics (mean, rstd, losses, rowmax, ...) and parameter gradients are f32.
// Shapes use N = tokens (batch * seq), C = hidden, V = vocabulary, F = intermediate,
// B = batch, T = sequence, Hq/Hkv = query/key-value heads, D = head dim.
// Gradients of parameters are accumulated (+=) so micro-batches add up; gradients
// of activations are written (=) unless stated otherwise.
#pragma once
#include <string>

#include "lns/core/errors.h"
#include "lns/core/op_table.h"
#include "lns/core/tensor.h"

namespace lns {

enum class NormType { RMSNorm, LayerNorm };

// ---- embedding -------------------------------------------------------------------
// weight[Vl,C] holds vocabulary rows [row_begin, row_begin + Vl) (all of them when not
// vocab-parallel). out[N,C] = weight[ids[n] - row_begin, :], or 0 when ids[n] is
// another rank's row.                                    ids[N] i32
inline void embedding_forward(Tensor out, Tensor ids, Tensor weight, int64_t row_begin = 0) {
  LNS_OP(embedding_forward, out.device)(out, ids, weight, row_begin);
}
// dweight[ids[n] - row_begin, :] += dout[n, :] for this rank's rows, in token order
// (deterministic, no atomics)
inline void embedding_backward(Tensor dweight, Tensor ids, Tensor dout, int64_t row_begin = 0) {
  LNS_OP(embedding_backward, dweight.device)(dweight, ids, dout, row_begin);
}

// ---- normalization -----------------------------------------------------------------
// out[N,C] = scale * (xhat * gain + bias), xhat = (x - mean) * rstd   (LayerNorm)
//                                          xhat = x * rstd            (RMSNorm)
// Saves mean[N] (LayerNorm only; pass an empty tensor for RMSNorm) and rstd[N].
// bias[C] is empty for RMSNorm. `scale` is the LNS factor 1/sqrt(l) (1 elsewhere).
inline void norm_forward(NormType type, Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor gain,
                         Tensor bias, float scale, float eps) {
  LNS_OP(norm_forward, x.device)(type, out, mean, rstd, x, gain, bias, scale, eps);
}
// Fused residual add: res_out[N,C] = alpha * res_in + delta, then out = norm(res_out).
// res_out may alias res_in.
inline void residual_norm_forward(NormType type, Tensor res_out, Tensor out, Tensor mean, Tensor rstd,
                                  Tensor res_in, Tensor delta, float alpha, Tensor gain, Tensor bias,
                                  float scale, float eps) {
  LNS_OP(residual_norm_forward, res_in.device)(type, res_out, out, mean, rstd, res_in, delta, alpha, gain, bias,
                                               scale, eps);
}
// dx[N,C] = dres[N,C] + d(norm)/dx . dout   (dres may be empty = 0; dx may alias dres)
// dgain[C] += ..., dbias[C] += ... (dbias empty for RMSNorm). x is the norm's input.
inline void norm_backward(NormType type, Tensor dx, Tensor dgain, Tensor dbias, Tensor dres, Tensor dout,
                          Tensor x, Tensor mean, Tensor rstd, Tensor gain, float scale) {
  LNS_OP(norm_backward, dout.device)(type, dx, dgain, dbias, dres, dout, x, mean, rstd, gain, scale);
}

// ---- fixed-divisor norm (LN-free fine-tuning, docs/ln_free.md) -------------------------
// The norm's divisor (the RMS; the standard deviation for LayerNorm, which still subtracts
// its measured mean) replaced by a constant. Row n of x is row row0 + n of the micro-batch
// (row0 > 0: a rank's share of the tokens under --sequence_parallel), at sequence position
// (row0 + n) % T: position 0 divides by pos0, positions > 0 by rest, except that with
// eot >= 0 a row whose token ids[n] == eot divides by pos0 too (the end-of-text case).
// CPU and CUDA (src/cuda/norm.cu: the live kernels with the divisor given, reading ids on
// the device; calibration sums a per-row f64 divisor kernel); both ask fixed_uses_pos0.
#if defined(__CUDACC__)
#define LNS_HOST_DEVICE __host__ __device__
#else
#define LNS_HOST_DEVICE
#endif
// The rule, once: does micro-batch row `row` (token `id`) divide by the position-0
// constant? Calibration measures that constant on the rows at position 0 alone
// (fixed_uses_pos0(row, T, 0, -1)).
LNS_HOST_DEVICE inline bool fixed_uses_pos0(int64_t row, int64_t T, int32_t id, int32_t eot) {
  return row % T == 0 || (eot >= 0 && id == eot);
}
struct FixedDivisor {
  float pos0 = 1.0f, rest = 1.0f;
  int64_t T = 1;     // sequence length
  int32_t eot = -1;  // end-of-text id; -1: no end-of-text case (ids unused)
  Tensor ids{};      // [N] i32 token ids of x's rows, on the device of x, when eot >= 0
  int64_t row0 = 0;  // x's first row in the micro-batch (its rows' positions start there)
  bool uses_pos0(int64_t n) const;  // host rows (CPU): fixed_uses_pos0 of x's row n
};
// The divisors' precondition (finite, > 0: a UserError, as they come from calibration
// or a checkpoint), checked before either backend runs.
void check_fixed_divisor(const FixedDivisor& d);
// out[N,C] = scale * ((x - mean)/d * gain + bias); saves mean[N] (LayerNorm) and rstd[N]=1/d.
inline void norm_forward_fixed(NormType type, Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor gain,
                               Tensor bias, float scale, FixedDivisor d) {
  check_fixed_divisor(d);
  LNS_OP(norm_forward_fixed, x.device)(type, out, mean, rstd, x, gain, bias, scale, d);
}
// As norm_backward, with no gradient through the (constant) divisor.
inline void norm_backward_fixed(NormType type, Tensor dx, Tensor dgain, Tensor dbias, Tensor dres,
                                Tensor dout, Tensor x, Tensor mean, Tensor rstd, Tensor gain, float scale) {
  LNS_OP(norm_backward_fixed, dout.device)(type, dx, dgain, dbias, dres, dout, x, mean, rstd, gain, scale);
}
// Calibration: adds to sums = {sum of divisors at position 0, their count, sum at positions
// > 0, their count} the measured divisor sqrt(var + eps) of every row of x[N,C] (rows in
// order, f64; row n at position (row0 + n) % T). Sums from several batches/ranks add; the
// constant is sum / count.
inline void norm_divisor_sums(NormType type, Tensor x, int64_t T, float eps, double sums[4], int64_t row0 = 0) {
  LNS_CHECK(T > 0 && row0 >= 0);
  LNS_OP(norm_divisor_sums, x.device)(type, x, T, eps, sums, row0);
}

// ---- linear (no bias; weights [out, in] as torch.nn.Linear) ---------------------------
// y[N,out] = x[N,in] @ w[out,in]^T
inline void linear_forward(Tensor y, Tensor x, Tensor w) {
  LNS_OP(linear_forward, y.device)(y, x, w);
}
// dx[N,in] = dy @ w (or += when accumulate_dx; dx may be empty), dw[out,in] += dy^T @ x
inline void linear_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, bool accumulate_dx) {
  LNS_OP(linear_backward, dy.device)(dx, dw, dy, x, w, accumulate_dx);
}

// ---- rotary position embedding, half-split (rotate_half) layout ------------------------
// In place on x[B,T,H,D]; cos/sin tables [T, D/2] (see model/rope.h). Position = t.
inline void rope_forward(Tensor x, Tensor cos, Tensor sin) {
  LNS_OP(rope_forward, x.device)(x, cos, sin);
}
// In place on dx[B,T,H,D] (the inverse rotation).
inline void rope_backward(Tensor dx, Tensor cos, Tensor sin) {
  LNS_OP(rope_backward, dx.device)(dx, cos, sin);
}

// ---- causal self-attention with grouped-query heads --------------------------------------
// out[B,T,Hq,D] = softmax(q k^T / sqrt(D), causal) v ; query head h reads kv head
// h / (Hq/Hkv). q[B,T,Hq,D], k,v[B,T,Hkv,D]. `saved` holds what backward needs, of
// attention_saved_shape(): the probabilities [B,Hq,T,T] on the CPU, only the row
// log-sum-exp [B,Hq,T] on CUDA (backward recomputes the scores, so memory stays
// linear in T; docs/cuda.md).
//
// Three CUDA implementations (the CPU has one, the reference, and ignores `impl`):
// Materialized (cuBLASLt products through bounded [T,T] score chunks, any head dim),
// Fused (one tensor-core kernel per pass, FlashAttention-2 style, head dims
// fused_attention_takes()) and Cudnn (cuDNN's fused attention, libcudnn loaded at run
// time, head dims cudnn_attention_takes(); src/cuda/sdpa.h) with its deterministic
// backward, or CudnnNondeterministic with its faster one that sums with atomics (same
// numbers up to the order of additions). All save the same log-sum-exp, but a backward
// must use the forward's impl. The choice is made once per model (choose_attention_impl).
enum class AttentionImpl { Auto, Fused, Materialized, Cudnn, CudnnNondeterministic };
// "auto", "fused", "materialized", "cudnn", "cudnn_nondeterministic"
const char* attention_impl_name(AttentionImpl a);
bool is_cudnn(AttentionImpl a);  // either cuDNN variant
// Throws UserError naming `flag` and the accepted values.
AttentionImpl parse_attention_impl(const std::string& s, const std::string& flag = "--attention");
// Head dims the fused kernels are compiled for: 64 and 128.
bool fused_attention_takes(int64_t head_dim);
// Head dims cuDNN's fused attention takes in bf16: multiples of 8 up to 128.
bool cudnn_attention_takes(int64_t head_dim);
// What runs for a model on `device` with this head dim: on CUDA, Fused for Auto when
// the fused kernels take the head dim, else Materialized; Fused or a cuDNN variant asked
// for a head dim it does not take is a UserError naming `flag`. Off CUDA always Materialized
// (the CPU's one attention, whatever was asked).
AttentionImpl choose_attention_impl(AttentionImpl requested, Device device, int64_t head_dim,
                                    const std::string& flag = "--attention");
// The library behind `impl`, loaded now so that a missing one stops the run before its
// first step: "cuDNN 9.13.0 (path)" for the cuDNN variants, empty for the project's own
// kernels. UserError naming `flag` when it cannot be loaded.
std::string attention_library(AttentionImpl impl, const std::string& flag = "--attention");
Shape attention_saved_shape(Device device, int64_t B, int64_t T, int64_t Hq);
inline void attention_forward(Tensor out, Tensor saved, Tensor q, Tensor k, Tensor v,
                              AttentionImpl impl = AttentionImpl::Materialized) {
  LNS_OP(attention_forward, out.device)(out, saved, q, k, v, impl);
}
// dq[B,T,Hq,D], dk, dv[B,T,Hkv,D] written (=). out[B,T,Hq,D] is the forward's output:
// the fused backward needs it (delta = rowsum(dout * out)); others accept it empty.
inline void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor saved, Tensor q,
                               Tensor k, Tensor v, Tensor out = {},
                               AttentionImpl impl = AttentionImpl::Materialized) {
  LNS_OP(attention_backward, dq.device)(dq, dk, dv, dout, saved, q, k, v, out, impl);
}

// ---- attention over a key/value cache (generation: LlamaStage::decode) -----------------
// n new queries at positions pos..pos+n-1 against the cached keys and values of positions
// 0..pos+n-1 (the new ones already written to the cache). For query i and head h (kv head
// g = h / (Hq/Hkv)):
//   out[i,h,:] = sum_{j <= pos+i} softmax_j(q[i,h,:] . kcache[j,g,:] / sqrt(D)) vcache[j,g,:]
// which is what attention_forward gives the last n rows of a sequence of pos + n tokens.
// q, out [n,Hq,D]; kcache, vcache [Tmax,Hkv,D] with pos + n <= Tmax; scores [n,Hq,Tmax] f32
// scratch (the probabilities on return). f32 arithmetic on both devices (bf16 in and out
// on CUDA, head dims up to 256).
inline void attention_decode(Tensor out, Tensor scores, Tensor q, Tensor kcache, Tensor vcache, int64_t pos) {
  LNS_OP(attention_decode, out.device)(out, scores, q, kcache, vcache, pos);
}

// ---- SwiGLU ------------------------------------------------------------------------------
// out[N,F] = silu(gate) * up
inline void swiglu_forward(Tensor out, Tensor gate, Tensor up) {
  LNS_OP(swiglu_forward, out.device)(out, gate, up);
}
// dgate[N,F], dup[N,F] written
inline void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) {
  LNS_OP(swiglu_backward, dout.device)(dgate, dup, dout, gate, up);
}

// ---- cross-entropy --------------------------------------------------------------------------
constexpr int32_t kIgnoreIndex = -100;
// Targets that carry loss (not kIgnoreIndex) among targets[0, n).
inline int64_t count_unmasked(const int32_t* targets, int64_t n) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) c += targets[i] != kIgnoreIndex;
  return c;
}
// Vocab-parallel pieces. logits[N,Vl] hold vocabulary columns [col_begin, col_begin + Vl);
// only the first `valid` are real (the rest is tensor-parallel padding and ignored).
// The forward reads the logits once: vocab_max_sumexp_target gives each rank's row max
// and its sum of exponentials relative to that max; the caller keeps a copy of the max,
// all-reduces rowmax (max), rescales sumexp to the global max (vocab_sumexp_rescale) and
// all-reduces sumexp and target (sum).
// rowmax[N] = max over valid columns; sumexp[N] = sum_j exp(logits[n,j] - rowmax[n]) over
// valid columns; target[N] = logits[n, t - col_begin] when this rank holds target t, else 0.
inline void vocab_max_sumexp_target(Tensor rowmax, Tensor sumexp, Tensor target, Tensor logits, Tensor targets,
                                    int64_t col_begin, int64_t valid) {
  LNS_OP(vocab_max_sumexp_target, logits.device)(rowmax, sumexp, target, logits, targets, col_begin, valid);
}
// sumexp[n] *= exp(local_max[n] - global_max[n]) (0 where this rank's max is -inf); all [N]
inline void vocab_sumexp_rescale(Tensor sumexp, Tensor local_max, Tensor global_max) {
  LNS_OP(vocab_sumexp_rescale, sumexp.device)(sumexp, local_max, global_max);
}
// losses[N] = log(sumexp) + rowmax - target, 0 on ignored rows
inline void cross_entropy_combine(Tensor losses, Tensor rowmax, Tensor sumexp, Tensor target,
                                  Tensor targets) {
  LNS_OP(cross_entropy_combine, losses.device)(losses, rowmax, sumexp, target, targets);
}
// dlogits[N,Vl] = grad_scale * (exp(logits - rowmax) / sumexp - onehot) on valid columns,
// 0 on padding columns and ignored rows. dlogits may alias logits.
inline void vocab_cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor rowmax, Tensor sumexp,
                                         Tensor targets, int64_t col_begin, int64_t valid,
                                         float grad_scale) {
  LNS_OP(vocab_cross_entropy_backward, logits.device)(dlogits, logits, rowmax, sumexp, targets, col_begin, valid,
                                                      grad_scale);
}
// Single-device compositions of the pieces:
// losses[N] = logsumexp(logits[n,:]) - logits[n, targets[n]]; 0 where targets[n] == -100.
void cross_entropy_forward(Tensor losses, Tensor logits, Tensor targets);
// dlogits[N,V] = grad_scale * (softmax(logits) - onehot(target)), 0 on ignored rows.
// dlogits may alias logits. grad_scale is 1 / (non-ignored tokens of the whole batch).
void cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor targets, float grad_scale);

// ---- elementwise ---------------------------------------------------------------------------
// y[n] = a * y[n] + b * x[n]            (f32, or bf16 on CUDA with f32 arithmetic)
inline void axpby(Tensor y, float a, Tensor x, float b) {
  LNS_OP(axpby, y.device)(y, a, x, b);
}
// dst[n] = src[n] converted between f32 and bf16 (round to nearest even), same device.
inline void cast(Tensor dst, Tensor src) {
  LNS_OP(cast, src.device)(dst, src);
}

// ---- a learned scalar on one addend (scale_res_pre_norm) ---------------------------------
// r[N,C] = a * x + f, a = alpha[0] (f32 [1], a parameter on the tensors' device).
// scale_res_pre_norm scales the sublayer's output, so the stage passes F as x and the
// residual stream as f: r = b * F + x.
inline void scaled_residual_forward(Tensor r, Tensor x, Tensor f, Tensor alpha) {
  LNS_OP(scaled_residual_forward, r.device)(r, x, f, alpha);
}
// dalpha[0] += sum(dr * x) (deterministic order), then dx[N,C] = a * dr. dx may alias dr.
inline void scaled_residual_backward(Tensor dx, Tensor dalpha, Tensor dr, Tensor x, Tensor alpha) {
  LNS_OP(scaled_residual_backward, dx.device)(dx, dalpha, dr, x, alpha);
}

// ---- Gumbel-routed block (routed, mono, mono_reverse; lns/model/block_plan.h) ------------------
// The router's hard Gumbel-softmax gate (tau = 1), per sequence b:
//   logits[b,k] = sum_c (mean_t x[b,t,c]) * w[k,c]          x [B,T,C] (bf16 on CUDA), w [2,C] f32
//   soft[b,:]   = softmax(logits[b,:] + noise[b,:])         noise [B,2] f32 (zeros: no noise)
//   gate[b,:]   = onehot(argmax soft[b,:]), index 0 on a tie gate, soft [B,2] f32
// Means and dot products in f64 in a fixed order (identical bits on every run).
inline void route_gate_forward(Tensor gate, Tensor soft, Tensor x, Tensor w, Tensor noise) {
  LNS_OP(route_gate_forward, x.device)(gate, soft, x, w, noise);
}
// Straight-through estimator (d soft = dgate):
//   dlogits[b,k] = soft[b,k] * (dgate[b,k] - sum_j dgate[b,j] soft[b,j])
//   dw[k,c] += sum_b dlogits[b,k] * mean_t x[b,t,c];  dx[b,t,c] += sum_k dlogits[b,k] w[k,c] / T
inline void route_gate_backward(Tensor dx, Tensor dw, Tensor dgate, Tensor soft, Tensor x, Tensor w) {
  LNS_OP(route_gate_backward, x.device)(dx, dw, dgate, soft, x, w);
}
// y[b,t,c] = gate[b,0] * p0[b,t,c] + gate[b,1] * p1[b,t,c]     y, p0, p1 [B,T,C]; gate [B,2] f32
inline void route_mix_forward(Tensor y, Tensor p0, Tensor p1, Tensor gate) {
  LNS_OP(route_mix_forward, y.device)(y, p0, p1, gate);
}
// dp0 = gate[b,0] * dy, dp1 = gate[b,1] * dy (written);
// dgate[b,k] = sum_{t,c} dy * p_k (written, f64 sums in a fixed order)
inline void route_mix_backward(Tensor dp0, Tensor dp1, Tensor dgate, Tensor dy, Tensor p0, Tensor p1, Tensor gate) {
  LNS_OP(route_mix_backward, dy.device)(dp0, dp1, dgate, dy, p0, p1, gate);
}

}  // namespace lns

namespace lns {

// ---- optimizer -------------------------------------------------------------------------
// One AdamW step (decoupled weight decay, as torch.optim.AdamW) on flat f32 buffers,
// all [n]: p -= lr*wd*p; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
// p -= lr * (m/bc1) / (sqrt(v/bc2) + eps), with bc1 = 1-b1^t, bc2 = 1-b2^t.
// p_compute (optional, bf16 [n]) receives the updated p rounded to bf16: the weights
// the CUDA backend's GEMMs read, written in the same pass.
struct AdamWHyper {
  float lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2;
};
inline void adamw_step(Tensor p, Tensor g, Tensor m, Tensor v, const AdamWHyper& h,
                       Tensor p_compute = {}) {
  LNS_OP(adamw_step, p.device)(p, g, m, v, h, p_compute);
}
// sum of x[i]^2 in double (gradient norms); deterministic on both devices
inline double sum_squares(Tensor x) {
  return LNS_OP(sum_squares, x.device)(x);
}
// x[i] *= a
inline void scale_inplace(Tensor x, float a) {
  LNS_OP(scale_inplace, x.device)(x, a);
}

}  // namespace lns
