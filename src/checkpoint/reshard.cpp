// Resharding: logical tensors from any source into any layout. Reading takes this
// rank's slice (tensor-parallel shard with its padding, ZeRO range of the moments);
// writing builds every rank of a target layout in this process. The on-disk format
// itself is checkpoint.cpp's.
#include <memory>

#include <absl/strings/str_format.h>

#include "lns/checkpoint/checkpoint.h"
#include "lns/core/errors.h"
#include "lns/model/model_layout.h"
#include "lns/core/output_dir.h"
#include "lns/model/stage.h"

namespace lns {

void load_from_source(const TensorSource& src, ParamSet& params, AdamW* optim) {
  for (int i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params.info(i);
    if (!src.has(p.name, "param")) fail(src.where(), ": missing weight '", p.name, "'");
    const auto shape = src.logical_shape(p.name);
    if (!p.takes_file_shape(Shape(shape)))
      fail(src.where(), ": tensor '", p.name, "' has shape ", Shape(shape).str(),
           ", expected ", p.logical.str());
    const int64_t n = p.shape.numel(), cols = p.shape[p.shape.ndim - 1],
                  lcols = p.logical[p.logical.ndim - 1];
    // Local element k -> its logical index, or -1 for tensor-parallel padding.
    auto logical_index = [&](int64_t k) -> int64_t {
      int64_t li, lj;
      return p.to_logical(k / cols, k % cols, &li, &lj) ? li * lcols + lj : -1;
    };
    const std::vector<float> w = src.logical(p.name, "param");
    float* dst = params.host_param(i).f32();
    for (int64_t k = 0; k < n; ++k) dst[k] = logical_index(k) >= 0 ? w[logical_index(k)] : 0.0f;
    if (!optim || !src.has(p.name, "exp_avg")) continue;
    const int64_t lo = std::max<int64_t>(optim->begin(), p.offset),
                  hi = std::min<int64_t>(optim->end(), p.offset + n);
    if (lo >= hi) continue;
    for (const char* kind : {"exp_avg", "exp_avg_sq"}) {
      const std::vector<float> mom = src.logical(p.name, kind);
      float* out = (std::string(kind) == "exp_avg" ? optim->exp_avg() : optim->exp_avg_sq()).f32();
      const int64_t off = static_cast<int64_t>(p.offset);
      for (int64_t k = lo - off; k < hi - off; ++k)
        out[off + k - optim->begin()] = logical_index(k) >= 0 ? mom[logical_index(k)] : 0.0f;
    }
  }
  params.upload();  // CUDA: the host mirrors written above go to the device
  if (optim) optim->upload();
}

std::vector<std::string> write_checkpoint_from_source(const TensorSource& src, const LlamaConfig& cfg,
                                                      const Layout& target,
                                                      const std::string& pp_layers,
                                                      const RunState& state,
                                                      const AdamWConfig& adam, int64_t optim_steps,
                                                      const std::string& out_dir, bool overwrite) {
  const Layout layout = layout_for_model(cfg, target, pp_layers);
  StagedDir out(out_dir, "--out", overwrite, checkpoint_inventory, "an lns checkpoint");
  const bool with_optim = src.has(LlamaStage::model_params(cfg).front().name, "exp_avg");
  std::vector<nlohmann::json> shards;
  std::vector<std::string> summary;
  for (int rank = 0; rank < layout.world_size(); ++rank) {
    const RankCoords at = layout.coords_of(rank);
    const StageSpec spec = stage_spec(layout, at.pp);
    ParamSet ps = LlamaStage::stage_params(cfg, spec, {at.tp, layout.tp, nullptr});
    ps.finalize();
    std::unique_ptr<AdamW> optim;
    if (with_optim) {
      const ShardRange s = layout.zero_shard(ps.numel(), at.dp);
      optim = layout.zero ? std::make_unique<AdamW>(ps, adam, s.begin, s.end()) : std::make_unique<AdamW>(ps, adam);
      optim->set_steps_taken(optim_steps);
    }
    load_from_source(src, ps, optim.get());
    shards.push_back(write_rank_shard(out.path(), ps, optim.get(), layout, at));
    summary.push_back(absl::StrFormat("rank %d (tp %d, dp %d, pp %d: layers %d..%d): %s, %d bytes", rank, at.tp,
                                      at.dp, at.pp, spec.first_layer, spec.last_layer - 1,
                                      shards.back()["name"].get<std::string>(),
                                      shards.back()["bytes"].get<int64_t>()));
  }
  std::optional<OptimizerRecord> optim;
  if (with_optim) optim = OptimizerRecord{adam, optim_steps};
  RunState written = state;
  written.fp8 = {};  // the FP8 scaling state is not carried over: a run resumed from here starts its scales afresh
  write_manifest(out.path(), shards, cfg, layout, written, optim);
  out.commit();
  return summary;
}

}  // namespace lns
