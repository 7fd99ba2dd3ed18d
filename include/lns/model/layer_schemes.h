// --layer_schemes: which block form each layer runs, for --norm_scheme=hybrid (the
// reference repository's per-layer hybrids as one pattern instead of one flag each).
//
//   PATTERN = ITEM[,ITEM...][,*]      ITEM = FORM[:COUNT]
//
// Items give COUNT consecutive layers of FORM, in order from layer 0. COUNT defaults
// to 1, except that a last item without a count (and no "*") takes every remaining
// layer. A trailing "*" repeats the whole pattern until every layer has a form (the
// last repetition may be cut short). Without "*" the counts must add up to the model's
// layers exactly. FORM is a scheme that describes one block by itself: pre, lns, post,
// deeppost, sandwich, scale_res_pre_norm, routed (the rest are patterns or init rules, not
// block forms). mono is pre:3,routed,* and mono_reverse post:3,routed,*.
//
//   pre:7,post          first 7 layers Pre-LN, the rest Post-LN
//   pre:7,sandwich      first 7 Pre-LN, the rest sandwich
//   pre:3,post,*        every 4th layer Post-LN among Pre-LN (layers 3, 7, 11, ...)
//   post:3,pre,*        the reverse: every 4th layer Pre-LN among Post-LN
//
// Layers are counted by trained depth (LlamaConfig::depth_of), so a model with layers
// removed keeps each block's form.
#pragma once
#include <string>
#include <vector>

#include "lns/model/config.h"

namespace lns {

// True for the schemes that are a single block's form (allowed in a pattern).
bool is_block_form(NormScheme s);
// The form of every layer 0..num_layers-1. UserError naming `flag` on a bad pattern.
std::vector<NormScheme> resolve_layer_schemes(const std::string& pattern, int num_layers,
                                              const std::string& flag = "--layer_schemes");

}  // namespace lns
