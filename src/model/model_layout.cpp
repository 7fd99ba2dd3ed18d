#include "lns/model/model_layout.h"

#include "lns/core/errors.h"

namespace lns {

Layout layout_for_model(const LlamaConfig& cfg, Layout layout, const std::string& pp_layers) {
  const int tp = layout.tp, pp = layout.pp;
  LNS_REQUIRE(cfg.num_heads % tp == 0, "--num_heads=", cfg.num_heads, " must be divisible by --tp=", tp);
  LNS_REQUIRE(cfg.num_kv_heads % tp == 0, "--num_kv_heads=", cfg.num_kv_heads, " must be divisible by --tp=", tp);
  LNS_REQUIRE(pp <= cfg.num_layers, "--pp=", pp, " stages for --num_layers=", cfg.num_layers,
              ": every stage needs at least one layer");
  layout.stage_layers = split_layers(cfg.num_layers, pp, pp_layers, layout.virtual_stages);
  return layout;
}

StageSpec stage_spec(const Layout& layout, int pp_rank) {
  const auto chunks = layout.stage_chunks(pp_rank);
  StageSpec spec{chunks[0].first, chunks[0].second, layout.first_stage(pp_rank), layout.last_stage(pp_rank)};
  if (chunks.size() > 1) spec.chunks = chunks;
  return spec;
}

}  // namespace lns
