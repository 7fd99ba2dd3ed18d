// A CUDA build configured without cuDNN's headers (src/cuda/sdpa.h): --attention=cudnn
// stops before the first step and says how to get them; the other attentions run.
#include "cuda/sdpa.h"
#include "lns/core/errors.h"

namespace lns::cuda {
namespace {
[[noreturn]] void absent(const std::string& flag) {
  fail(flag, ": this binary was built without cuDNN's headers; run bash tools/fetch_cudnn.sh, "
       "reconfigure with -DLNS_CUDA=ON and rebuild, or use --attention=fused");
}
}  // namespace

std::string sdpa_library(const std::string& flag) { absent(flag); }
void sdpa_forward(const SdpaProblem&, const SdpaForward&, CUstream_st*) { absent("--attention=cudnn"); }
void sdpa_backward(const SdpaProblem&, const SdpaBackward&, CUstream_st*) { absent("--attention=cudnn"); }

}  // namespace lns::cuda
