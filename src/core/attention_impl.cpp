// Which attention implementation a model runs (include/lns/core/ops.h, AttentionImpl): the
// one place that knows which shapes the fused kernels take.
#include "lns/core/backend.h"
#include "lns/core/errors.h"
#include "lns/core/files.h"
#include "lns/core/ops.h"

namespace lns {

const char* attention_impl_name(AttentionImpl a) {
  switch (a) {
    case AttentionImpl::Auto: return "auto";
    case AttentionImpl::Fused: return "fused";
    case AttentionImpl::Materialized: return "materialized";
    case AttentionImpl::Cudnn: return "cudnn";
    case AttentionImpl::CudnnNondeterministic: return "cudnn_nondeterministic";
  }
  return "?";
}

bool is_cudnn(AttentionImpl a) { return a == AttentionImpl::Cudnn || a == AttentionImpl::CudnnNondeterministic; }

AttentionImpl parse_attention_impl(const std::string& s, const std::string& flag) {
  if (s == "auto") return AttentionImpl::Auto;
  if (s == "fused") return AttentionImpl::Fused;
  if (s == "materialized") return AttentionImpl::Materialized;
  if (s == "cudnn") return AttentionImpl::Cudnn;
  if (s == "cudnn_nondeterministic") return AttentionImpl::CudnnNondeterministic;
  fail(flag, "=", printable(s), " is not an attention implementation; expected auto, fused, cudnn, "
       "cudnn_nondeterministic or materialized");
}

// The fused kernels (src/cuda/flash_attention.cu) are instantiated for these.
bool fused_attention_takes(int64_t head_dim) { return head_dim == 64 || head_dim == 128; }

// cuDNN's support table for bf16 fused attention on Ampere and Hopper (its larger head
// dims need newer versions and are left out); the emulator's stand-in checks the same.
bool cudnn_attention_takes(int64_t head_dim) { return head_dim > 0 && head_dim % 8 == 0 && head_dim <= 128; }

AttentionImpl choose_attention_impl(AttentionImpl requested, Device device, int64_t head_dim,
                                    const std::string& flag) {
  // The CPU has one attention, the reference: the flag is about CUDA, so a flagfile
  // written for a GPU run still runs (and evaluates) on the CPU.
  if (device != Device::CUDA) return AttentionImpl::Materialized;
  const bool fits = fused_attention_takes(head_dim);
  switch (requested) {
    case AttentionImpl::Auto: return fits ? AttentionImpl::Fused : AttentionImpl::Materialized;
    case AttentionImpl::Materialized: return AttentionImpl::Materialized;
    case AttentionImpl::Fused:
      if (!fits)
        fail(flag, "=fused takes head dims 64 and 128 (hidden_size / num_heads), got ", head_dim,
             "; use --attention=materialized or auto");
      return AttentionImpl::Fused;
    case AttentionImpl::Cudnn:
    case AttentionImpl::CudnnNondeterministic:
      if (!cudnn_attention_takes(head_dim))
        fail(flag, "=", attention_impl_name(requested), " takes head dims that are multiples of 8 up to 128 "
             "(hidden_size / num_heads), got ", head_dim, "; use --attention=materialized or auto");
      return requested;
  }
  return AttentionImpl::Materialized;
}

Shape attention_saved_shape(Device device, int64_t B, int64_t T, int64_t Hq) {
  return device == Device::CUDA ? Shape{B, Hq, T} : Shape{B, Hq, T, T};
}

std::string attention_library(AttentionImpl impl, const std::string& flag) {
  DeviceBackend* b = device_backend(Device::CUDA);
  if (is_cudnn(impl) && b) return b->attention_library(flag + "=" + attention_impl_name(impl));
  return "";
}

}  // namespace lns
