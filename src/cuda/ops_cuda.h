// The CUDA backend of include/lns/ops.h: one function per op, same arguments, same
// meaning (see ops.h for shapes); reached through LNS_DISPATCH (src/core/dispatch.h).
// Everything runs on the stream of cuda/runtime.h, in order.
#pragma once
#include "lns/fp8_linear.h"
#include "lns/ops.h"

namespace lns::cuda {

void embedding_forward(Tensor out, Tensor ids, Tensor weight, int64_t row_begin);
void embedding_backward(Tensor dweight, Tensor ids, Tensor dout, int64_t row_begin);

void norm_forward(NormType type, Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor gain,
                  Tensor bias, float scale, float eps);
void residual_norm_forward(NormType type, Tensor res_out, Tensor out, Tensor mean, Tensor rstd,
                           Tensor res_in, Tensor delta, float alpha, Tensor gain, Tensor bias,
                           float scale, float eps);
void norm_backward(NormType type, Tensor dx, Tensor dgain, Tensor dbias, Tensor dres, Tensor dout,
                   Tensor x, Tensor mean, Tensor rstd, Tensor gain, float scale);
void norm_forward_fixed(NormType type, Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor gain,
                        Tensor bias, float scale, FixedDivisor d);
void norm_backward_fixed(NormType type, Tensor dx, Tensor dgain, Tensor dbias, Tensor dres, Tensor dout,
                         Tensor x, Tensor mean, Tensor rstd, Tensor gain, float scale);
void norm_divisor_sums(NormType type, Tensor x, int64_t T, float eps, double sums[4], int64_t row0);

void linear_forward(Tensor y, Tensor x, Tensor w);
void linear_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, bool accumulate_dx);
void linear_forward_fp8_shared(const std::vector<Tensor>& ys, Tensor x, const std::vector<Tensor>& ws,
                               const std::vector<Fp8Linear>& fs);
void linear_backward_fp8_shared(Tensor dx, const std::vector<Tensor>& dws, const std::vector<Tensor>& dys, Tensor x,
                                const std::vector<Tensor>& ws, bool accumulate_dx, const std::vector<Fp8Linear>& fs);
int64_t fp8_weight_cast_numel(Tensor w, const Fp8Linear& f);
void fp8_cast_weight(Tensor w_cast, Tensor w, const Fp8Linear& f);

void rope_forward(Tensor x, Tensor cos, Tensor sin);
void rope_backward(Tensor dx, Tensor cos, Tensor sin);

void attention_forward(Tensor out, Tensor saved, Tensor q, Tensor k, Tensor v, AttentionImpl impl);
void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor saved, Tensor q,
                        Tensor k, Tensor v, Tensor out, AttentionImpl impl);
// The fused kernels behind AttentionImpl::Fused (flash_attention.cu); lse [B,Hq,T].
void flash_attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v);
void flash_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor lse, Tensor q, Tensor k,
                              Tensor v, Tensor out);

void attention_decode(Tensor out, Tensor scores, Tensor q, Tensor kcache, Tensor vcache, int64_t pos);

void swiglu_forward(Tensor out, Tensor gate, Tensor up);
void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up);

void vocab_max_sumexp_target(Tensor rowmax, Tensor sumexp, Tensor target, Tensor logits, Tensor targets,
                             int64_t col_begin, int64_t valid);
void vocab_sumexp_rescale(Tensor sumexp, Tensor local_max, Tensor global_max);
void cross_entropy_combine(Tensor losses, Tensor rowmax, Tensor sumexp, Tensor target,
                           Tensor targets);
void vocab_cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor rowmax, Tensor sumexp,
                                  Tensor targets, int64_t col_begin, int64_t valid,
                                  float grad_scale);

void axpby(Tensor y, float a, Tensor x, float b);
void cast(Tensor dst, Tensor src);
void scaled_residual_forward(Tensor r, Tensor x, Tensor f, Tensor alpha);
void scaled_residual_backward(Tensor dx, Tensor dalpha, Tensor dr, Tensor x, Tensor alpha);

void route_gate_forward(Tensor gate, Tensor soft, Tensor x, Tensor w, Tensor noise);
void route_gate_backward(Tensor dx, Tensor dw, Tensor dgate, Tensor soft, Tensor x, Tensor w);
void route_mix_forward(Tensor y, Tensor p0, Tensor p1, Tensor gate);
void route_mix_backward(Tensor dp0, Tensor dp1, Tensor dgate, Tensor dy, Tensor p0, Tensor p1, Tensor gate);

void adamw_step(Tensor p, Tensor g, Tensor m, Tensor v, const AdamWHyper& h, Tensor p_compute);
double sum_squares(Tensor x);
void scale_inplace(Tensor x, float a);

}  // namespace lns::cuda
