// The model-shape flags (--vocab_size ... --embed_init_std), named as in Megatron/HF.
#pragma once
#include "lns/model/config.h"

namespace lns {

// Builds and validates the config from the flags; UserError naming the flag.
LlamaConfig config_from_flags();

}  // namespace lns
