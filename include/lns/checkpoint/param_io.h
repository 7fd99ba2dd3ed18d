// Moving a ParamSet's tensors in and out of safetensors files by name.
#pragma once
#include <string>

#include "lns/model/param_set.h"
#include "lns/checkpoint/safetensors.h"

namespace lns {

// True for names that denote model weights ("model.*", "lm_head.*"). Other tensors
// in a file (a step dump's inputs, logits, grad.*) are not weights and are ignored, and
// so is RoPE's "...rotary_emb.inv_freq" buffer, which older Hugging Face LLaMAs and the
// reference repository's model save beside the weights (its frequencies follow from
// rope_theta).
bool is_weight_name(const std::string& name);

// Loads every parameter of `params` (a stage, or a tensor-parallel shard, of the
// model `cfg`) from `file`, which holds the whole model's logical tensors. A missing
// tensor, a weight the model does not have, or a wrong shape is a UserError naming
// the file.
void load_params(ParamSet& params, const SafetensorsReader& file, const LlamaConfig& cfg);

}  // namespace lns
