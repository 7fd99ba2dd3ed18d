// The step-state dump (--dump_step_state): everything one forward/backward of the
// first batch computed, for comparing layouts, backends and external references.
// Format (safetensors), all CPU f32 unless noted:
//   inputs   I32 [B, T]   token ids fed to the model
//   targets  I32 [B, T]   next-token targets, -100 where the loss is masked
//   logits   F32 [B, T, V]
//   loss     F32 []       mean cross-entropy over non-masked targets
//   grad.<name>  F32, the logical shape of every parameter (before any optimizer step)
//   __metadata__: config (JSON of LlamaConfig), seq_len, micro_batch_size, format
#pragma once
#include <string>

#include "lns/config.h"
#include "lns/param_set.h"

namespace lns {

struct StepState {
  Tensor inputs, targets, logits;  // views; written as given
  float loss = 0.0f;
};

void write_step_state(const std::string& path, const LlamaConfig& cfg, const ParamSet& params,
                      const StepState& state);

}  // namespace lns
