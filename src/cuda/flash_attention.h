// The fused attention kernels behind AttentionImpl::Fused (flash_attention.cu), called by
// attention.cu's dispatch of the attention ops; shapes as attention_forward's
// (include/lns/core/ops.h), lse [B,Hq,T] the row log-sum-exp the backward reads.
#pragma once
#include "lns/core/tensor.h"

namespace lns::cuda {

void flash_attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v);
void flash_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor lse, Tensor q, Tensor k,
                              Tensor v, Tensor out);

}  // namespace lns::cuda
