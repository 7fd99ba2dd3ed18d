// The parallel layout: a plain value (no MPI, no model) and the one place that knows
// its rules. Megatron order, tensor-parallel rank innermost, then data-parallel, then
// pipeline outermost:
//
//     rank = tp + dp * TP + pp * TP * DP        (Layout::rank_of / coords_of)
//
// Who owns what and when they talk:
//  - tp group (same dp, pp): splits attention heads, FFN width and vocabulary
//    (parallel/shard.h); one all-reduce after o_proj and down_proj (forward) and
//    after the q/k/v and gate/up input gradients (backward); max/sum-exp all-reduces
//    in the loss.
//  - dp group (same tp, pp): disjoint shares of every global batch; gradients summed
//    after backward (all-reduce, or reduce-scatter + all-gather with --zero, each dp
//    rank owning zero_shard() of the flat buffer).
//  - sequence parallelism (tp > 1, --sequence_parallel): between the tensor-parallel
//    linears (norms, residual adds) tp rank r holds only sequence_shard(tokens, r) of
//    each micro-batch's tokens; the tp all-reduces of activations become a
//    reduce-scatter after o_proj / down_proj (and the embedding) and an all-gather
//    before q/k/v, gate/up (and the head); replicated parameters' gradients (norms)
//    are partial over tokens and summed over tp once per step.
//  - pipeline: stage s holds global layers stage_layers[s] = [first, last); it sends
//    activations to the same (tp, dp) rank of stage s+1 and receives gradients back.
//    With V = virtual_stages > 1 (interleaved 1F1B) the layers are cut into P*V model
//    chunks, stage_layers[k] for chunk k, dealt round-robin: chunk k = c*P + s is
//    chunk c of stage s (chunk_index). Stage P-1 sends chunk c's output to stage 0's
//    chunk c+1. Layer numbers stay global, so every scheme computes what it did.
//  - embed group (tied embeddings, pp > 1): the first and the last stage of the same
//    (tp, dp) sum the embedding gradient so both copies stay equal.
//
// The stage split needs the number of layers, which the model knows: the model side
// fills it (layout_for_model in lns/model/model_layout.h); this file splits counts only.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "parallel/shard.h"

namespace lns {

class JsonIn;

// Where one rank sits in the layout.
struct RankCoords {
  int tp = 0, dp = 0, pp = 0;
  bool operator==(const RankCoords&) const = default;
};

struct Layout {
  int tp = 1, pp = 1, dp = 1;
  bool zero = false;  // ZeRO-1: AdamW moments sharded over the dp ranks
  int virtual_stages = 1;  // V: model chunks per pipeline rank (interleaved 1F1B)
  bool sequence_parallel = false;  // as asked (--sequence_parallel); see sequence_parallel_on
  // Global layers [first, last) of each model chunk (of each stage when V = 1), in
  // layer order; empty until the model side splits.
  std::vector<std::pair<int, int>> stage_layers;

  int world_size() const { return tp * pp * dp; }
  // --zero as asked (lns_train and lns_convert default to true): ZeRO shards only over
  // more than one dp rank, so with dp = 1 the layout (and its brief, its manifest) says no.
  void set_zero(bool asked) { zero = asked && dp > 1; }
  // Sequence parallelism happens only with tp > 1 (with one tp rank there is nothing
  // to split; the flag is then accepted and has no effect).
  bool sequence_parallel_on() const { return sequence_parallel && tp > 1; }
  // The tokens of a micro-batch of `tokens` ([B,T] row-major) that tp rank `tp_rank`
  // holds between the tensor-parallel linears: a contiguous 1/tp of them (all of them
  // without sequence parallelism). check_sequence_length makes it exact.
  ShardRange sequence_shard(int64_t tokens, int tp_rank) const;
  // Whether tp rank `tp_rank` adds its per-token statistics of the split region (norm
  // inputs, the residual stream) to a sum over ranks: each rank its own share under
  // sequence parallelism; otherwise the tp ranks hold copies and rank 0 speaks for them.
  bool counts_split_tokens(int tp_rank) const { return tp_rank == 0 || sequence_parallel_on(); }
  // UserError naming --seq_len and --tp when sequence parallelism is on and the
  // sequence length is not a multiple of tp (no padding: every rank holds seq_len/tp
  // tokens of each sequence's worth).
  void check_sequence_length(int64_t seq_len) const;
  // The rank formula, both ways; the only place it is written.
  int rank_of(RankCoords c) const;
  RankCoords coords_of(int rank) const;
  bool first_stage(int pp_rank) const { return pp_rank == 0; }
  bool last_stage(int pp_rank) const { return pp_rank == pp - 1; }
  // The global layers [first, last) of stage pp_rank (the split must be filled; V = 1).
  std::pair<int, int> stage_range(int pp_rank) const;
  // Model chunk c of stage pp_rank is chunk chunk_index() of the model: round-robin.
  int chunk_index(int pp_rank, int c) const { return c * pp + pp_rank; }
  // The global layers [first, last) of each of stage pp_rank's V chunks, in order.
  std::vector<std::pair<int, int>> stage_chunks(int pp_rank) const;
  // The ranks a stage's chunks talk to: the same (tp, dp) on the stage after / before,
  // wrapping around from the last stage to the first for the next chunk.
  int next_stage_rank(RankCoords c) const { return rank_of({c.tp, c.dp, (c.pp + 1) % pp}); }
  int prev_stage_rank(RankCoords c) const { return rank_of({c.tp, c.dp, (c.pp + pp - 1) % pp}); }
  // The part of a flat buffer of `numel` elements that dp rank `dp_rank` owns under
  // ZeRO (and sums in the gradient norm either way): the split of parallel/shard.h.
  ShardRange zero_shard(int64_t numel, int dp_rank) const { return shard_range(numel, dp, dp_rank); }

  // "tp=2 pp=2 dp=2" (+ " zero", + " sp"): one line for logs, dumps and tool output.
  std::string brief() const;
  // "world 8 = tp 2 x dp 2 x pp 2 (rank = ...)" and one line per stage with its
  // global layers and ranks, printed at start-up.
  std::string describe() const;
  // The manifest's "layout" object: {"tp", "pp", "dp", "zero", "stage_layers"}, and
  // "virtual_stages" when it is above 1 (absent reads as 1), and "sequence_parallel":
  // true only when asked (older manifests stay byte-identical).
  nlohmann::json to_json() const;
  // Reads and validates that object (pp * virtual_stages ranges that cover
  // 0..num_layers in order, each at least one layer); UserError naming the file and field.
  static Layout from_json(const JsonIn& j, int num_layers);

  bool operator==(const Layout&) const = default;
};

// The layout of `world` ranks with tp x pp model-parallel ranks: dp = world / (tp * pp).
// UserError naming --tp / --pp when they are below 1 or do not divide the world.
Layout layout_for_world(int tp, int pp, int world);

// The global layers [first, last) of every model chunk, pp * virtual_stages of them
// in layer order: an even split with the extra layers on the first chunks, or the
// counts of --pp_layers=a,b,c (one per chunk). UserError when the counts do not add
// up, a chunk would be empty, or --virtual_stages is below 1 or above 1 with --pp=1.
std::vector<std::pair<int, int>> split_layers(int num_layers, int pp, const std::string& pp_layers,
                                              int virtual_stages = 1);

}  // namespace lns
