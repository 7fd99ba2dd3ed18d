// cuDNN's fused attention (AttentionImpl::Cudnn), behind one small interface that two
// builds implement:
//   src/cuda/cudnn/sdpa_cudnn.cpp  the real library, through the cudnn-frontend graph
//                                  API, libcudnn.so.9 loaded at run time (a binary
//                                  without it still runs the other attentions);
//   src/cuda/cudnn/sdpa_absent.cpp a CUDA build configured without the headers;
//   src/cuda/sim/cudnn_sdpa.cpp    the emulator's stand-in: it checks what the library
//                                  requires and computes on the CPU, as the cuBLASLt one.
// attention.cu describes the tensors; nothing else knows cuDNN. Which head dims it
// takes is cudnn_attention_takes() (include/lns/core/ops.h).
//
// Layout, the projections' own (no permutes): q, o, dout, dq [B,T,Hq,D]; k, v, dk, dv
// [B,T,Hkv,D], all bf16 and dense; stats [B,Hq,T] f32, the natural-log log-sum-exp of
// each query's scaled scores (the same quantity the fused kernels save, so the two are
// interchangeable). Causal, top-left aligned; query head h reads kv head h / (Hq/Hkv).
#pragma once
#include <cstdint>
#include <string>


struct CUstream_st;

namespace lns::cuda {

struct SdpaProblem {
  int64_t B = 0, T = 0, Hq = 0, Hkv = 0, D = 0;
  float scale = 0.0f;          // 1 / sqrt(D)
  bool deterministic = true;   // the backward's algorithm: fixed order, or atomics (faster)
};
struct SdpaForward {
  uint16_t* o;  // bf16 bits, as every tensor here but stats
  float* stats;
  const uint16_t *q, *k, *v;
};
struct SdpaBackward {
  uint16_t *dq, *dk, *dv;
  const uint16_t *q, *k, *v, *o, *dout;
  const float* stats;
};

// Loads the library (once per process) and says which: "cuDNN 9.13.0 (<path>)". Throws
// UserError starting with `flag` (e.g. "--attention=cudnn") when it cannot be loaded,
// with what was tried.
std::string sdpa_library(const std::string& flag);

// One causal attention pass on `stream`. The first call for a shape builds the plan
// (logged once with its time and workspace); later calls reuse it.
void sdpa_forward(const SdpaProblem& p, const SdpaForward& t, CUstream_st* stream);
void sdpa_backward(const SdpaProblem& p, const SdpaBackward& t, CUstream_st* stream);

}  // namespace lns::cuda
