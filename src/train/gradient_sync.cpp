#include "lns/gradient_sync.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "lns/device.h"
#include "lns/errors.h"
#include "lns/ops.h"

namespace lns {
namespace {

// True when [from, to) of the flat buffer overlaps a tensor (not just padding): an
// uncounted tensor lies between two counted ones, so they cannot be merged.
bool gap_counted(int64_t from, int64_t to, const ParamSet& params) {
  for (const ParamInfo& p : params.infos())
    if (int64_t(p.offset) < to && int64_t(p.offset) + p.shape.numel() > from) return true;
  return false;
}

}  // namespace

GradientSync::GradientSync(ProcessGrid& grid, ParamSet& params, bool tied, bool zero,
                           double bucket_mb)
    : grid_(grid), params_(params), tied_(tied), zero_(zero && grid.layout.dp > 1),
      bucket_floats_(std::max<int64_t>(1024, static_cast<int64_t>(bucket_mb * 1024 * 1024 / 4))) {
  const ShardRange s = grid.layout.zero_shard(params.numel(), grid.coords.dp);
  // Clamped: with more dp ranks than elements a share can lie past the buffer's end.
  begin_ = std::min(s.begin, params.numel());
  end_ = std::min(s.end(), params.numel());
  shard_size_ = s.size;
  // The counted parameters within this rank's share, merged into runs of adjacent
  // tensors: one reduction (one GPU synchronisation) per run instead of per tensor.
  // Gaps between tensors of a run are alignment padding, whose gradients are zero.
  for (const ParamInfo& p : params.infos()) {
    if (!p.counted_on(grid.coords.tp)) continue;
    const int64_t lo = std::max<int64_t>(begin_, p.offset), hi = std::min<int64_t>(end_, p.offset + p.shape.numel());
    if (lo >= hi) continue;
    if (!norm_ranges_.empty() && norm_ranges_.back().second <= lo && !gap_counted(norm_ranges_.back().second, lo, params))
      norm_ranges_.back().second = hi;
    else
      norm_ranges_.push_back({lo, hi});
  }
  if (tied && grid.layout.pp > 1 && (grid.first_stage() || grid.last_stage())) {
    const int i = params.find("model.embed_tokens.weight");
    if (i >= 0) hold_lo_ = params.info(i).offset, hold_hi_ = hold_lo_ + params.info(i).shape.numel();
  }
  // ZeRO in place when the flat buffers' slack holds dp * shard elements (ParamSet::kSlack);
  // otherwise through staging copies of the whole buffer.
  in_place_ = shard_size_ * grid.layout.dp <= params.numel() + ParamSet::kSlack;
  if (zero_ && !in_place_) {
    padded_ = OwnedTensor(DType::F32, Shape{shard_size_ * grid.layout.dp}, params.device());
    shard_ = OwnedTensor(DType::F32, Shape{shard_size_}, params.device());
  }
}

void GradientSync::reduce(bool full) {
  // 1. Tied embedding copies on the first and last stage.
  if (tied_ && grid_.layout.pp > 1 && (grid_.first_stage() || grid_.last_stage())) {
    // Overlapped dp sums may still run: the embed group's sum goes behind them, so one
    // communicator at a time has work in flight (the deferred buckets start after it).
    if (armed_) grid_.dp_comm().all_reduce_wait();
    const int i = params_.find("model.embed_tokens.weight");
    LNS_CHECK(i >= 0) << "tied embeddings: the first and last stage both hold the embedding";
    grid_.embed_comm().all_reduce(params_.grad(i), ReduceOp::Sum);
  }
  if (grid_.layout.dp == 1) return;
  const Tensor g = params_.flat_grads();
  const int64_t n = params_.numel();
  if (armed_) {  // 2a, overlapped: start what backward has not, then wait for all
    grads_ready(0);
    for (int64_t k : deferred_) {
      const int64_t b = k * bucket_floats_;
      grid_.dp_comm().all_reduce_start(g.rows(b, std::min(n, b + bucket_floats_)));
    }
    deferred_.clear();
    grid_.dp_comm().all_reduce_wait();
    armed_ = false;
    return;
  }
  if (!zero_ || full) {  // 2a. all-reduce in buckets
    for (int64_t b = 0; b < n; b += bucket_floats_)
      grid_.dp_comm().all_reduce(g.rows(b, std::min(n, b + bucket_floats_)), ReduceOp::Sum);
    return;
  }
  // 2b. reduce-scatter: this rank receives the sum of its shard.
  if (in_place_) {  // NCCL's in-place form: the shard's sum lands where the shard is
    const int64_t s = shard_size_, at = grid_.coords.dp * s;
    const Tensor all = params_.flat_grads_padded(s * grid_.layout.dp);
    grid_.dp_comm().reduce_scatter(all.rows(at, at + s), all);
    return;
  }
  copy_tensor(padded_.t.rows(0, n), g);
  zero_tensor(padded_.t.rows(n, padded_.t.numel()));
  grid_.dp_comm().reduce_scatter(shard_, padded_);
  copy_tensor(g.rows(begin_, end_), shard_.t.rows(0, end_ - begin_));
}

void GradientSync::arm_overlap() {
  if (grid_.layout.dp == 1 || zero_) return;  // ZeRO's reduce-scatter needs the whole buffer
  // With tp > 1, backward all-reduces over tp on the compute stream: on NCCL that is a
  // second communicator with work in flight beside the dp sums, which NCCL documents
  // as unsafe (a hang). Ordering them would serialise backward; do not overlap.
  if (grid_.layout.tp > 1 && grid_.dp_comm().overlaps_compute()) return;
  armed_ = true;
  next_bucket_ = (params_.numel() + bucket_floats_ - 1) / bucket_floats_ - 1;
}

void GradientSync::grads_ready(int64_t from) {
  if (!armed_) return;
  const Tensor g = params_.flat_grads();
  const int64_t n = params_.numel();
  // Buckets are fixed slices [k*B, (k+1)*B) of the flat buffer, as without overlap;
  // backward finishes them from the last one down.
  for (; next_bucket_ >= 0 && next_bucket_ * bucket_floats_ >= from; --next_bucket_) {
    const int64_t b = next_bucket_ * bucket_floats_, e = std::min(n, b + bucket_floats_);
    if (b < hold_hi_ && e > hold_lo_)
      deferred_.push_back(next_bucket_);
    else
      grid_.dp_comm().all_reduce_start(g.rows(b, e));
  }
}

double GradientSync::global_norm() {
  const Tensor g = params_.flat_grads();
  double sum = 0.0;
  for (const auto& [lo, hi] : norm_ranges_) sum += sum_squares(g.rows(lo, hi));
  return std::sqrt(grid_.world().all_reduce_sum(sum));
}

void GradientSync::scale(float f) {
  if (f == 1.0f) return;
  const Tensor g = params_.flat_grads();
  if (zero_)
    scale_inplace(g.rows(begin_, end_), f);
  else
    scale_inplace(g, f);
}

void GradientSync::gather_params() {
  if (!zero_) return;
  if (in_place_) {  // every rank's updated shard, gathered where it belongs
    const int64_t s = shard_size_, at = grid_.coords.dp * s;
    const Tensor all = params_.flat_params_padded(s * grid_.layout.dp);
    grid_.dp_comm().all_gather(all, all.rows(at, at + s));
    params_.refresh_compute();  // CUDA: the bf16 weights of the other ranks' shards
    return;
  }
  const Tensor p = params_.flat_params();
  const int64_t n = params_.numel();
  zero_tensor(shard_);
  copy_tensor(shard_.t.rows(0, end_ - begin_), p.rows(begin_, end_));
  grid_.dp_comm().all_gather(padded_, shard_);
  copy_tensor(p, padded_.t.rows(0, n));
  params_.refresh_compute();  // CUDA: the bf16 weights of the other ranks' shards
}

}  // namespace lns
