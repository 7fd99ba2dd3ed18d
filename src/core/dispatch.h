// Device dispatch for the ops of include/lns/ops.h. Each op is implemented once per
// backend: the CPU version (src/cpu) starts with LNS_DISPATCH, which forwards the call
// to lns::cuda (src/cuda) when its tensor lives on the GPU.
#pragma once
#include "lns/errors.h"
#include "lns/tensor.h"

#ifdef LNS_WITH_CUDA
#include "cuda/op_profile.h"
#include "cuda/ops_cuda.h"
// The op profile (lns/op_profile.h) times each call from here: one place sees them all.
#define LNS_DISPATCH(tensor, call)                                   \
  do {                                                               \
    if ((tensor).device == ::lns::Device::CUDA) {                    \
      ::lns::cuda::OpScope lns_op_scope_(__FILE__);                  \
      return ::lns::cuda::call;                                      \
    }                                                                \
  } while (0)
#else
#define LNS_DISPATCH(tensor, call)                                              \
  LNS_CHECK((tensor).device == ::lns::Device::CPU)                              \
      << "a CUDA tensor reached a build without CUDA support (-DLNS_CUDA=OFF)"
#endif
