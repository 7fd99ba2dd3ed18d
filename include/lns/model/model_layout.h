// What the model asks of a parallel layout, in one place: heads and kv heads divisible
// by tp, no more stages than layers, and the split of its global layers over the
// stages. Every program that places a model on ranks (the trainer, lns_eval, the
// checkpoint writer behind lns_convert) goes through layout_for_model, and asks
// stage_spec for a stage instead of assembling one.
#pragma once
#include <string>

#include "lns/model/config.h"
#include "lns/model/stage.h"
#include "parallel/layout.h"

namespace lns {

// `layout` (sizes, virtual_stages and zero) with the split into stages (model chunks
// when virtual_stages > 1) filled in: even, or the counts of pp_layers ("a,b,c").
// UserError naming the flags when the model does not fit.
Layout layout_for_model(const LlamaConfig& cfg, Layout layout, const std::string& pp_layers);

// The stage that pipeline rank pp_rank of a split layout holds (its chunks, when the
// layout interleaves).
StageSpec stage_spec(const Layout& layout, int pp_rank);

}  // namespace lns
