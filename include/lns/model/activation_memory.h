// The activation-memory account of a pipeline stage: the bytes LlamaStage plans for
// its activations (lns/model/stage.h), per micro-batch in flight and per layer, under the
// layer's recompute mode (lns/model/recompute.h), computed from the shapes alone. Printed at
// start-up by the trainer; tests hold the stage's allocations to it, and
// tools/perf/step_model.py's memory model keeps the same terms.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lns/model/stage.h"

namespace lns {

struct ActivationAccount {
  struct Layer {
    int global = 0;  // global layer index
    RecomputeMode mode = RecomputeMode::None;
    int64_t kept_bytes = 0;  // what one micro-batch keeps from forward to backward
  };
  std::vector<Layer> layers;
  int64_t stage_bytes = 0;      // per micro-batch outside the layers: ids, h0 (each chunk's), final norm, logits, loss
  int64_t workspace_bytes = 0;  // once: the buffers recomputing layers share
  int64_t gradient_bytes = 0;   // once: backward's gradient buffers
  int num_slots = 1;            // micro-batches in flight (of chunk 0)
  // --virtual_stages: per chunk, the micro-batches in flight (chunk_slots()) and the bytes
  // one of its slots holds (its layers' and its own ids/h0/head). One entry for one chunk.
  std::vector<int> chunk_slots{1};
  std::vector<int64_t> chunk_bytes{0};

  int64_t per_micro_batch() const;  // layers + stage_bytes (a micro-batch passes every chunk)
  int64_t total() const;            // sum over chunks of slots * bytes + workspace + gradients
  // A few lines: runs of equal layers with their bytes, then the totals.
  std::string str() const;
};

// Device bytes of the stage LlamaStage(cfg, spec, B, T, chunk_slots, tp, device) plans
// for activations (parameters, RoPE tables and kernel scratch not included). With
// tp.sequence_parallel the split regions count the rank's tokens (tp.token_shard, as
// LlamaStage::hidden_tokens()), the tensor-parallel regions all B*T. Excluded:
// LN-free's late allocations (v's normalised copy and statistics, allocated when the
// --ln_free schedule splits a value norm, after start-up).
ActivationAccount activation_account(const LlamaConfig& cfg, StageSpec spec, int64_t B, int64_t T,
                                     const std::vector<int>& chunk_slots, TensorParallel tp, Device device);
// The same number of slots for every chunk.
ActivationAccount activation_account(const LlamaConfig& cfg, StageSpec spec, int64_t B, int64_t T,
                                     int num_slots, TensorParallel tp, Device device);

}  // namespace lns
