// GradientSync: everything that happens to gradients between backward and the
// optimizer, across ranks.
//  1. Tied embeddings with pp > 1: the first stage's embedding gradient and the last
//     stage's head copy are summed over the embed group, so both copies take the
//     same update and stay equal.
//  2. Data parallelism: gradients summed over the dp group (the loss is already
//     normalised by the global token count) in buckets of --dp_bucket_mb, fixed
//     slices [k*B, (k+1)*B) of the flat buffer. Without ZeRO (--zero=false) each
//     bucket is all-reduced. With ZeRO (the default when dp > 1) each dp rank owns the
//     contiguous shard Layout::zero_shard of the flat buffer, where the optimizer
//     runs: a bucket is cut where the shards meet and each piece is reduced to its
//     owner only (half an all-reduce's traffic); updated shards are all-gathered.
//     With overlap armed (the last micro-batch's backward, dp > 1), each bucket is
//     started as soon as the stage reports that every gradient in it is final
//     (grads_ready), so on NCCL it runs beside the rest of backward. Overlapped or
//     not, the pieces and their order are the same (last bucket first): same bits.
//  3. Sequence parallelism: each tp rank's gradients of replicated parameters (norm
//     gains and biases, learned residual scales) cover only its share of the tokens;
//     they are summed over the tp group, packed into one all-reduce per step. Always
//     after step 2: overlapped buckets are summed over dp inside backward, so doing
//     the tp sum last in both paths gives both the same association, the same bits.
//  4. The global gradient norm counts every parameter once: each dp rank sums its
//     shard, tensor-parallel replicas (norms) count on tp rank 0 only, the tied copy
//     not at all; one all-reduce over the world.
#pragma once
#include "lns/model/param_set.h"
#include "parallel/process_grid.h"

namespace lns {

class GradientSync {
 public:
  // tied: the model ties embeddings (every rank must agree, so it is the config's
  // flag, not whether this stage happens to hold the embedding). ZeRO is the layout's
  // (Layout::set_zero: on only with dp > 1).
  GradientSync(ProcessGrid& grid, ParamSet& params, bool tied, double bucket_mb);

  bool zero() const { return zero_; }
  // The flat range [begin, end) of this dp rank: its optimizer shard under ZeRO and
  // its share of the gradient norm either way.
  int64_t shard_begin() const { return begin_; }
  int64_t shard_end() const { return end_; }

  // Steps 1 to 3. full: all-reduce even under ZeRO, so every rank holds the whole
  // summed gradient (step dumps).
  void reduce(bool full = false);
  // Overlap: arm() before the last micro-batch's backward; the stage then calls
  // grads_ready(from) whenever the gradients at flat offsets >= from are final.
  void arm_overlap();
  void grads_ready(int64_t from);
  double global_norm();    // step 4 (after reduce)
  // Silent data errors (docs/resilience.md). begin_step: starts a new fingerprint of this
  // rank's own gradients, taken of each piece just before its first sum across ranks
  // (of the whole buffer at reduce() with dp = 1), so that two runs of one step can say
  // whose gradients differed. flip_bit: a test fault (--inject_fault=bitflip): one bit
  // of the first nonzero gradient of the first piece flips before its fingerprint.
  // Host gradients only: on CUDA the fingerprint stays 0 and nothing flips.
  void begin_step(bool flip_bit);
  uint64_t local_fingerprint() const { return fingerprint_; }
  void scale(float f);     // clipping: scales the gradients the optimizer will read
  // ZeRO (no-op otherwise): every rank gets what its kernels read of every updated
  // shard. On the CPU that is the f32 master weights. On CUDA it is the bf16 copy plus
  // the f32 tensors read in f32 (ParamInfo::read_in_f32), not the f32 master of the
  // other shards: those stay stale until gather_master().
  void gather_params();
  // ZeRO: brings the f32 master weights of the other ranks' shards up to date after
  // gather_params (collective over dp; a no-op when they are current). Before anything
  // reads every master weight: checkpoints, the end-of-run check, tests.
  void gather_master();

 private:
  ProcessGrid& grid_;
  ParamSet& params_;
  bool tied_, zero_;
  bool in_place_ = false;  // ZeRO collectives on the flat buffers themselves (ParamSet::kSlack)
  int64_t bucket_floats_;
  int64_t begin_ = 0, end_ = 0, shard_size_ = 0;
  bool armed_ = false;
  int64_t next_bucket_ = -1;  // overlap: the highest bucket not yet started
  // Overlap with tied embeddings and pp > 1: buckets holding the embedding (or the
  // head's copy) wait for step 1 in reduce(), so the sums keep their order and bits.
  int64_t hold_lo_ = 0, hold_hi_ = 0;
  std::vector<int64_t> deferred_;
  int64_t num_buckets() const { return (params_.numel() + bucket_floats_ - 1) / bucket_floats_; }
  // Step 2 for bucket k: all-reduced (no ZeRO, or full), or its pieces reduced to
  // their owners; started beside compute (overlap) or at once.
  void sum_bucket(int64_t k, bool start, bool full);
  void sum_over_dp(bool full);  // step 2: every bucket, overlapped or not
  void fingerprint(int64_t b, int64_t e);  // of the flat gradients [b, e), flipping first if armed
  uint64_t fingerprint_ = 0;
  bool flip_pending_ = false;
  std::vector<std::pair<int64_t, int64_t>> norm_ranges_;  // flat ranges counted in the norm
  std::vector<std::pair<int64_t, int64_t>> tp_sum_ranges_;  // step 3: replicated tensors' flat ranges
  OwnedTensor tp_sum_;              // step 3 staging: the ranges packed
  void sum_replicated_over_tp();
  OwnedTensor padded_, shard_;      // ZeRO all-gather staging when not in place: [dp * shard], [shard]
  bool master_stale_ = false;       // other shards' f32 master weights older than their bf16 copy
  // CUDA ZeRO: per dp rank, the flat ranges of f32-read tensors in its shard; packed
  // into slots of f32_slot_ elements of f32_gather_ [dp * f32_slot_].
  std::vector<std::vector<std::pair<int64_t, int64_t>>> f32_runs_;
  int64_t f32_slot_ = 0;
  OwnedTensor f32_gather_;
};

}  // namespace lns
