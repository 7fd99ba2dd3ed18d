#include "lns/train/gradient_sync.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "lns/core/device.h"
#include "lns/core/errors.h"
#include "lns/core/ops.h"
#include "lns/train/step_guard.h"

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

GradientSync::GradientSync(ProcessGrid& grid, ParamSet& params, bool tied, double bucket_mb)
    : grid_(grid), params_(params), tied_(tied), zero_(grid.layout.zero),
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
  if (grid.layout.sequence_parallel_on()) {
    int64_t total = 0;
    for (const ParamInfo& p : params.infos()) {
      if (!p.replicated()) continue;
      const int64_t lo = p.offset, hi = lo + p.shape.numel();
      if (!tp_sum_ranges_.empty() && tp_sum_ranges_.back().second == lo)
        tp_sum_ranges_.back().second = hi;
      else
        tp_sum_ranges_.push_back({lo, hi});
      total += hi - lo;
    }
    if (total > 0) tp_sum_ = OwnedTensor(DType::F32, Shape{total}, params.device());
  }
  // ZeRO in place when the flat buffers' slack holds dp * shard elements (ParamSet::kSlack);
  // otherwise through staging copies of the whole buffer.
  in_place_ = shard_size_ * grid.layout.dp <= params.numel() + ParamSet::kSlack;
  if (zero_ && !in_place_) {
    padded_ = OwnedTensor(DType::F32, Shape{shard_size_ * grid.layout.dp}, params.device());
    shard_ = OwnedTensor(DType::F32, Shape{shard_size_}, params.device());
  }
  // ZeRO on CUDA: each dp rank's runs of f32-read tensors (ParamInfo::read_in_f32) within
  // its shard, for gather_params' packed all-gather; a slot holds the largest share.
  if (zero_ && in_place_ && params.device() != Device::CPU) {
    std::vector<std::pair<int64_t, int64_t>> runs;  // over the whole buffer, merged across padding
    for (const ParamInfo& p : params.infos()) {
      if (!p.read_in_f32()) continue;
      const int64_t lo = p.offset, hi = lo + p.shape.numel();
      if (!runs.empty() && !gap_counted(runs.back().second, lo, params))
        runs.back().second = hi;
      else
        runs.push_back({lo, hi});
    }
    for (int r = 0; r < grid.layout.dp; ++r) {
      const ShardRange s = grid.layout.zero_shard(params.numel(), r);
      int64_t count = 0;
      f32_runs_.emplace_back();
      for (const auto& [lo, hi] : runs) {
        const int64_t a = std::max(lo, s.begin), b = std::min(hi, s.end());
        if (a < b) f32_runs_.back().push_back({a, b}), count += b - a;
      }
      f32_slot_ = std::max(f32_slot_, count);
    }
    if (f32_slot_ > 0) f32_gather_ = OwnedTensor(DType::F32, Shape{f32_slot_ * grid.layout.dp}, params.device());
  }
}

void GradientSync::sum_replicated_over_tp() {
  if (tp_sum_ranges_.empty()) return;
  const Tensor g = params_.flat_grads();
  int64_t at = 0;
  for (const auto& [lo, hi] : tp_sum_ranges_) copy_tensor(tp_sum_.t.rows(at, at + hi - lo), g.rows(lo, hi)), at += hi - lo;
  grid_.tp_comm().all_reduce(tp_sum_, ReduceOp::Sum);
  at = 0;
  for (const auto& [lo, hi] : tp_sum_ranges_) copy_tensor(g.rows(lo, hi), tp_sum_.t.rows(at, at + hi - lo)), at += hi - lo;
}

void GradientSync::begin_step(bool flip_bit) {
  fingerprint_ = 0;
  flip_pending_ = flip_bit;
  if (flip_bit && params_.device() != Device::CPU)
    LOG(WARNING) << "--inject_fault=bitflip: only host gradients are flipped; nothing flips on " << device_name(params_.device());
}

void GradientSync::fingerprint(int64_t b, int64_t e) {
  if (params_.device() != Device::CPU || e <= b) return;
  float* g = params_.flat_grads().f32() + b;
  if (flip_pending_) {
    flip_pending_ = false;
    for (int64_t i = 0; i < e - b; ++i)
      if (g[i] != 0) {
        uint32_t w;
        std::memcpy(&w, &g[i], 4);
        w ^= 1u << 30;  // the exponent's top bit: a gradient of 1e-3 becomes about 3e35
        std::memcpy(&g[i], &w, 4);
        LOG(WARNING) << "inject_fault: flipped bit 30 of gradient element " << b + i << " on rank " << grid_.rank;
        break;
      }
  }
  fingerprint_ = fingerprint_words(g, e - b, fingerprint_ ^ static_cast<uint64_t>(b));
}

void GradientSync::reduce(bool full) {
  if (grid_.layout.dp == 1) fingerprint(0, params_.numel());  // nothing was summed across ranks yet
  // 1. Tied embedding copies on the first and last stage.
  if (tied_ && grid_.layout.pp > 1 && (grid_.first_stage() || grid_.last_stage())) {
    // Overlapped dp sums may still run: the embed group's sum goes behind them, so one
    // communicator at a time has work in flight (the deferred buckets start after it).
    if (armed_) grid_.dp_comm().all_reduce_wait();
    const int i = params_.find("model.embed_tokens.weight");
    LNS_CHECK(i >= 0) << "tied embeddings: the first and last stage both hold the embedding";
    grid_.embed_comm().all_reduce(params_.grad(i), ReduceOp::Sum);
  }
  sum_over_dp(full);
  // 3. Sequence parallelism: replicated parameters' token-partial gradients, summed
  //    over tp after the dp sums in both orders of work, since overlapped buckets
  //    start inside backward, before this point: summing over tp first without
  //    overlap would associate (a+b)+(c+d) against (a+c)+(b+d), other bits. Under
  //    ZeRO only the owner's piece holds the dp sum; the tp ranks of one dp rank own
  //    the same piece, so its tp sum is right where it is read.
  sum_replicated_over_tp();
}

void GradientSync::sum_over_dp(bool full) {
  if (grid_.layout.dp == 1) return;
  if (armed_) {  // 2, overlapped: start what backward has not, then wait for all
    grads_ready(0);
    for (int64_t k : deferred_) sum_bucket(k, /*start=*/true, /*full=*/false);
    deferred_.clear();
    grid_.dp_comm().all_reduce_wait();
    armed_ = false;
    return;
  }
  // 2, after backward: the same pieces as overlapped, in the same order (last bucket
  // first), so both give the same bits.
  for (int64_t k = num_buckets() - 1; k >= 0; --k) sum_bucket(k, /*start=*/false, full);
}

void GradientSync::sum_bucket(int64_t k, bool start, bool full) {
  const Tensor g = params_.flat_grads();
  const int64_t n = params_.numel(), b = k * bucket_floats_, e = std::min(n, b + bucket_floats_);
  fingerprint(b, e);
  Communicator& dp = grid_.dp_comm();
  if (!zero_ || full) {  // 2a. every rank gets the whole bucket's sum
    if (start)
      dp.all_reduce_start(g.rows(b, e));
    else
      dp.all_reduce(g.rows(b, e), ReduceOp::Sum);
    return;
  }
  // 2b. the bucket cut where the ZeRO shards meet; each piece summed on its owner.
  for (int r = 0; r < grid_.layout.dp; ++r) {
    const ShardRange s = grid_.layout.zero_shard(n, r);
    const int64_t lo = std::max(b, s.begin), hi = std::min(e, s.end());
    if (lo >= hi) continue;
    if (start)
      dp.reduce_start(g.rows(lo, hi), r);
    else
      dp.reduce(g.rows(lo, hi), r);
  }
}

void GradientSync::arm_overlap() {
  if (grid_.layout.dp == 1) return;
  // With tp > 1, backward all-reduces over tp on the compute stream: on NCCL that is a
  // second communicator with work in flight beside the dp sums, which NCCL documents
  // as unsafe (a hang). Ordering them would serialise backward; do not overlap.
  if (grid_.layout.tp > 1 && grid_.dp_comm().overlaps_compute()) return;
  armed_ = true;
  next_bucket_ = num_buckets() - 1;
}

void GradientSync::grads_ready(int64_t from) {
  if (!armed_) return;
  const int64_t n = params_.numel();
  // Buckets are fixed slices [k*B, (k+1)*B) of the flat buffer, as without overlap;
  // backward finishes them from the last one down.
  for (; next_bucket_ >= 0 && next_bucket_ * bucket_floats_ >= from; --next_bucket_) {
    const int64_t b = next_bucket_ * bucket_floats_, e = std::min(n, b + bucket_floats_);
    if (b < hold_hi_ && e > hold_lo_)
      deferred_.push_back(next_bucket_);
    else
      sum_bucket(next_bucket_, /*start=*/true, /*full=*/false);
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
  // The CPU's kernels read the f32 master weights, and so does the out-of-place path.
  if (params_.device() == Device::CPU || !in_place_) {
    master_stale_ = true;
    gather_master();
    params_.refresh_compute();  // CUDA: the bf16 weights of the other ranks' shards
    return;
  }
  // CUDA: the bf16 weights every GEMM reads, gathered in place on the compute copy ...
  const int64_t s = shard_size_, me = grid_.coords.dp;
  const Tensor bf16 = params_.flat_compute_padded(s * grid_.layout.dp);
  grid_.dp_comm().all_gather(bf16, bf16.rows(me * s, (me + 1) * s));
  // ... and the f32 tensors the kernels read (norm gains, ...), each rank's share packed
  // into one slot of f32_slot_ elements: one small all-gather.
  if (f32_slot_ > 0) {
    const Tensor p = params_.flat_params(), buf = f32_gather_.t;
    auto each_run = [&](int r, bool pack) {
      int64_t k = r * f32_slot_;
      for (const auto& [lo, hi] : f32_runs_[r]) {
        if (pack)
          copy_tensor(buf.rows(k, k + hi - lo), p.rows(lo, hi));
        else
          copy_tensor(p.rows(lo, hi), buf.rows(k, k + hi - lo));
        k += hi - lo;
      }
    };
    each_run(static_cast<int>(me), true);
    grid_.dp_comm().all_gather(buf, buf.rows(me * f32_slot_, (me + 1) * f32_slot_));
    for (int r = 0; r < grid_.layout.dp; ++r)
      if (r != me) each_run(r, false);
  }
  // The other f32 master weights outside this rank's shard are now older than their
  // bf16 copy; gather_master() brings them up to date when something reads them.
  master_stale_ = true;
}

void GradientSync::gather_master() {
  if (!zero_ || !master_stale_) return;
  master_stale_ = false;
  if (in_place_) {  // every rank's updated shard, gathered where it belongs
    const int64_t s = shard_size_, at = grid_.coords.dp * s;
    const Tensor all = params_.flat_params_padded(s * grid_.layout.dp);
    grid_.dp_comm().all_gather(all, all.rows(at, at + s));
    return;
  }
  const Tensor p = params_.flat_params();
  const int64_t n = params_.numel();
  zero_tensor(shard_);
  copy_tensor(shard_.t.rows(0, end_ - begin_), p.rows(begin_, end_));
  grid_.dp_comm().all_gather(padded_, shard_);
  copy_tensor(p, padded_.t.rows(0, n));
}

}  // namespace lns
