// ParamSet: every parameter of a stage (or a tensor-parallel shard of one) in one
// flat f32 buffer, gradients in a second one of the same layout. Flat buffers make
// all-reduce buckets, ZeRO sharding and checkpoint shards plain offset arithmetic.
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "lns/block_plan.h"
#include "lns/tensor.h"

namespace lns {

struct ParamInfo {
  std::string name;  // Hugging Face name with the global layer index
  Shape shape;
  size_t offset = 0;  // in elements, into the flat buffers
  ParamKind kind = ParamKind::NormGain;
  int layer = -1;     // global layer, -1 for embedding, final norm and head
  bool decays() const { return shape.ndim == 2; }  // weight decay on matrices only
};

class ParamSet {
 public:
  // Registers a parameter; only before finalize().
  int add(std::string name, Shape shape, ParamKind kind, int layer);
  // Allocates the zeroed flat buffers (params and grads).
  void finalize(Device device = Device::CPU);

  int size() const { return static_cast<int>(infos_.size()); }
  const ParamInfo& info(int i) const { return infos_[i]; }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  int find(const std::string& name) const;  // -1 if absent
  Tensor param(int i) const;
  Tensor grad(int i) const;
  Tensor flat_params() const { return params_.f32(Shape{numel_}); }
  Tensor flat_grads() const { return grads_.f32(Shape{numel_}); }
  int64_t numel() const { return numel_; }
  void zero_grads();

 private:
  std::vector<ParamInfo> infos_;
  std::unordered_map<std::string, int> index_;
  int64_t numel_ = 0;
  bool finalized_ = false;
  Buffer params_, grads_;
};

}  // namespace lns
