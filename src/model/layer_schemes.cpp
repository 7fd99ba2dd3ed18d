#include "lns/model/layer_schemes.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_split.h>

#include "lns/core/errors.h"
#include "lns/core/files.h"

namespace lns {

bool is_block_form(NormScheme s) {
  switch (s) {
    case NormScheme::Pre:
    case NormScheme::LNS:
    case NormScheme::Post:
    case NormScheme::DeepPost:
    case NormScheme::Sandwich:
    case NormScheme::ScaleResPre:
    case NormScheme::Routed:
      return true;
    default:
      return false;
  }
}

std::vector<NormScheme> resolve_layer_schemes(const std::string& pattern, int num_layers,
                                              const std::string& flag) {
  LNS_REQUIRE(!pattern.empty(), flag, " is empty; expected FORM[:COUNT],... (e.g. pre:7,post)");
  std::vector<std::string> items = absl::StrSplit(pattern, ',');
  const bool repeat = items.back() == "*";
  if (repeat) items.pop_back();
  LNS_REQUIRE(!items.empty(), flag, "=", printable(pattern), " has no FORM before '*'");
  struct Run {
    NormScheme form;
    int64_t count;  // -1: the rest
  };
  std::vector<Run> runs;
  int64_t fixed = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const std::vector<std::string> kv = absl::StrSplit(items[i], absl::MaxSplits(':', 1));
    NormScheme form = NormScheme::Mix;  // not a block form: refused below when unknown too
    try {
      form = parse_norm_scheme(kv[0]);
    } catch (const UserError&) {
    }
    LNS_REQUIRE(is_block_form(form), flag, "=", printable(pattern), ": '", printable(kv[0]),
                "' is not a block form; expected pre, lns, post, deeppost, sandwich, scale_res_pre_norm or routed");
    int64_t count = 1;
    if (kv.size() == 2) {
      LNS_REQUIRE(absl::SimpleAtoi(kv[1], &count) && count >= 1 && count <= kMaxLayers, flag, "=",
                  printable(pattern), ": count '", printable(kv[1]), "' of item ", i + 1,
                  " must be an integer in [1, ", kMaxLayers, "]");
    } else if (i + 1 == items.size() && !repeat) {
      count = -1;
    }
    if (count > 0) fixed += count;
    runs.push_back({form, count});
  }
  const bool fill = runs.back().count < 0;
  if (fill)
    LNS_REQUIRE(fixed < num_layers, flag, "=", printable(pattern), " gives ", fixed,
                " layers before its last item, which needs at least one of the ", num_layers);
  else if (!repeat)
    LNS_REQUIRE(fixed == num_layers, flag, "=", printable(pattern), " describes ", fixed, " layers but the model has ",
                num_layers, " (end with a FORM without count to fill, or '*' to repeat)");
  std::vector<NormScheme> out;
  out.reserve(num_layers);
  while (static_cast<int>(out.size()) < num_layers) {
    for (const Run& r : runs) {
      const int64_t n = r.count < 0 ? num_layers - fixed : r.count;
      for (int64_t k = 0; k < n && static_cast<int>(out.size()) < num_layers; ++k) out.push_back(r.form);
    }
    if (!repeat) break;
  }
  return out;
}

}  // namespace lns
