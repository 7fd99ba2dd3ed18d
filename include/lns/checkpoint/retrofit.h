// LNS retrofit of a pretrained Pre-LN model: the same weights, run as --norm_scheme=lns,
// so each block's two pre-norm outputs are multiplied by 1/sqrt(l) (l the 1-based
// trained depth). This changes the function: the loss jumps and recovers under
// fine-tuning (docs/retrofit.md has the study). lns_convert retrofit (our checkpoints)
// and import-hf --norm_scheme=lns (a Hugging Face LLaMA) both go through here, print
// the warning and record the conversion in the manifest.
#pragma once
#include <string>

#include "lns/model/config.h"
#include "lns/checkpoint/manifest.h"

namespace lns {

struct Retrofit {
  LlamaConfig config;       // the input model with norm_scheme = lns
  ConversionRecord record;  // for the manifest's "conversions"
  std::string warning;      // one line, for the user
};

// `from`: the input model (a Pre-LN scheme: pre or scaled_init, whose forward is
// pre's); `to`: the --norm_scheme value asked for (only "lns"). UserError naming the
// flag or the input otherwise.
Retrofit plan_lns_retrofit(const LlamaConfig& from, const std::string& to, const std::string& command,
                           const std::string& source);

}  // namespace lns
