// ParamSet: every parameter of a stage (or a tensor-parallel shard of one) in one
// flat f32 buffer, gradients in a second one of the same layout. Flat buffers make
// all-reduce buckets, ZeRO sharding and checkpoint shards plain offset arithmetic.
//
// On CUDA the f32 master weights and gradients live on the GPU, with a bf16 copy of
// the weights (same layout) that the GEMMs read, and host mirrors of weights and
// gradients for everything that reads or writes them on the host (initialisation,
// checkpoints, dumps): write the host mirror and upload(), or download() and read it.
// On the CPU the mirrors and the compute copy are the f32 buffers themselves.
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "lns/model/block_plan.h"
#include "lns/core/tensor.h"
#include "parallel/shard.h"

namespace lns {

struct ParamInfo {
  std::string name;  // Hugging Face name with the global layer index
  Shape shape;       // this rank's (local, possibly padded) shape
  size_t offset = 0;  // in elements, into the flat buffers
  ParamKind kind = ParamKind::NormGain;
  int layer = -1;     // global layer, -1 for embedding, final norm and head
  // Tensor parallelism: the logical (checkpoint) shape, the dimension split across
  // ranks (-1: replicated on every tp rank), and this rank's slice of it: indices
  // [shard_begin, shard_begin + shape[split_dim]) of the padded dimension, of which
  // the first shard_valid are real (the rest is zero padding).
  // shape[split_dim] is what the device stores (ShardRange::stored, >= shard_size);
  // shard_size is the rank's share by the tp rule, the extent a checkpoint piece has.
  Shape logical;
  int split_dim = -1;
  int64_t shard_begin = 0, shard_valid = 0, shard_size = 0;
  // The last stage's copy of a tied embedding: same values as the first stage's,
  // gradient summed with it; counted once in the global gradient norm.
  bool tied_copy = false;
  bool decays() const { return shape.ndim == 2; }  // weight decay on matrices only
  // Read by the kernels as f32 from the master weights, not from the bf16 copy (on
  // CUDA): norm gains and biases, residual scales, routers. ZeRO's gather after each
  // step moves these in f32 beside the bf16 weights (GradientSync::gather_params).
  bool read_in_f32() const {
    return kind == ParamKind::NormGain || kind == ParamKind::NormBias || kind == ParamKind::BranchScale ||
           kind == ParamKind::Router;
  }
  bool replicated() const { return split_dim < 0; }
  // The shape Hugging Face style files (export-hf, export-repo, export-folded) give this
  // tensor: its logical shape, but [] for a branch scale, which the reference
  // repository holds as a 0-dim tensor (nn.Parameter(torch.tensor(0.001))); our own
  // checkpoints keep [1]. A file read by name may hold either.
  Shape file_shape() const { return kind == ParamKind::BranchScale ? Shape{} : logical; }
  bool takes_file_shape(const Shape& s) const { return s == logical || s == file_shape(); }
  // The one rule for counting a parameter once across ranks (gradient norm, checkpoint
  // pieces, gathers): a replicated tensor counts on tensor-parallel rank 0 only, the
  // tied copy never (the first stage's embedding is the one that counts).
  bool counted_on(int tp_rank) const { return !tied_copy && (!replicated() || tp_rank == 0); }
  // Local element (i, j) -> logical (li, lj); false for padding.
  bool to_logical(int64_t i, int64_t j, int64_t* li, int64_t* lj) const;
};

// Index of the first element of p[0, n) that is inf or NaN, or -1.
int64_t first_non_finite(const float* p, int64_t n);

class ParamSet {
 public:
  // Registers a parameter; only before finalize().
  int add(std::string name, Shape shape, ParamKind kind, int layer);
  // A tensor-parallel shard: local shape = logical with split_dim replaced by s.stored.
  int add_shard(std::string name, Shape logical, int split_dim, const ShardRange& s, ParamKind kind, int layer);
  ParamInfo& mutable_info(int i) { return infos_[i]; }
  // Allocates the zeroed flat buffers (params and grads) on `device`.
  void finalize(Device device = Device::CPU);
  Device device() const { return params_.device(); }

  int size() const { return static_cast<int>(infos_.size()); }
  const ParamInfo& info(int i) const { return infos_[i]; }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  int find(const std::string& name) const;  // -1 if absent
  Tensor param(int i) const;    // f32 master, on device()
  Tensor grad(int i) const;     // f32, on device()
  Tensor compute(int i) const;  // what kernels read as weights: bf16 on CUDA, else param(i)
  Tensor host_param(int i) const;  // f32 on the host (the mirror on CUDA)
  Tensor host_grad(int i) const;
  Tensor flat_params() const { return params_.f32(Shape{numel_}); }
  Tensor flat_grads() const { return grads_.f32(Shape{numel_}); }
  Tensor flat_compute() const;  // bf16 [numel] on CUDA, empty on the CPU
  // The flat buffers (and the bf16 copy) are allocated kSlack zero elements longer
  // than numel(): the ZeRO rule's dp * shard elements (fewer than numel() + dp) exist,
  // so its all-gathers run in place for dp <= kSlack + 1 (GradientSync), moving no
  // staging copy. The first n elements, numel() <= n <= numel() + kSlack; the rest stays zero.
  static constexpr int64_t kSlack = 1024;
  Tensor flat_params_padded(int64_t n) const;
  Tensor flat_grads_padded(int64_t n) const;
  Tensor flat_compute_padded(int64_t n) const;  // bf16 on CUDA, empty on the CPU
  int64_t numel() const { return numel_; }
  void zero_grads();
  // Host mirror -> device master weights, and the bf16 compute copy refreshed.
  void upload();
  // Device -> host mirrors of the weights (and of the gradients).
  void download(bool grads = false);
  // bf16 compute copy from the f32 master (after weights change on the device
  // other than through AdamW, e.g. the ZeRO all-gather).
  void refresh_compute();

 private:
  std::vector<ParamInfo> infos_;
  std::unordered_map<std::string, int> index_;
  int64_t numel_ = 0;
  bool finalized_ = false;
  Buffer params_, grads_;
  Buffer compute_, host_params_, host_grads_;  // CUDA only
};

}  // namespace lns
