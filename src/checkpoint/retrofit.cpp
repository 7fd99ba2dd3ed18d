#include "lns/checkpoint/retrofit.h"

#include <absl/strings/str_format.h>

#include <cmath>

#include "lns/core/errors.h"
#include "lns/core/files.h"

namespace lns {

Retrofit plan_lns_retrofit(const LlamaConfig& from, const std::string& to, const std::string& command,
                           const std::string& source) {
  const NormScheme target = parse_norm_scheme(to);
  LNS_REQUIRE(target == NormScheme::LNS, command, ": --norm_scheme=", printable(to),
              " cannot be retrofitted; only lns (LayerNorm Scaling) is a retrofit of a Pre-LN model");
  LNS_REQUIRE(from.norm_scheme == NormScheme::Pre || from.norm_scheme == NormScheme::ScaledInit, command, ": ",
              source, " is a --norm_scheme=", norm_scheme_name(from.norm_scheme),
              " model; the LNS retrofit takes a Pre-LN model (pre or scaled_init)");
  // A folded model has no norm outputs to scale (its LNS scales are in its linears).
  LNS_REQUIRE(!from.folded_norms, command, ": ", source, " has its norms folded away (folded_norms); the LNS retrofit ",
              "scales pre-norm outputs, which it no longer has");
  Retrofit r;
  r.config = from;
  r.config.norm_scheme = NormScheme::LNS;
  r.config.validate();
  r.record = {command, norm_scheme_name(from.norm_scheme), "lns", source,
              "LNS retrofit: each block's two pre-norm outputs multiplied by 1/sqrt(l), l the 1-based depth; "
              "same weights, different function: fine-tune before use"};
  r.warning = absl::StrCat(
      "warning: ", command, " --norm_scheme=lns changes the model's function: each block's two pre-norm ",
      "outputs are now multiplied by 1/sqrt(l) (layer 1: 1, layer ", from.depth_layers(), ": ",
      absl::StrFormat("%.3g", 1.0 / std::sqrt(double(from.depth_layers()))),
      "), so the loss jumps until the model is fine-tuned (lns_train --resume); recorded in the manifest's "
      "\"conversions\"");
  return r;
}

}  // namespace lns
