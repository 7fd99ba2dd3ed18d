#include "lns/model/param_set.h"

#include <cmath>
#include <cstring>

#include "lns/core/device.h"
#include "lns/core/errors.h"
#include "lns/core/ops.h"

namespace lns {

int64_t first_non_finite(const float* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i])) return i;
  return -1;
}

int ParamSet::add(std::string name, Shape shape, ParamKind kind, int layer) {
  LNS_CHECK(!finalized_) << "ParamSet::add after finalize";
  LNS_CHECK(!index_.count(name)) << "duplicate parameter " << name;
  ParamInfo p;
  p.name = std::move(name);
  p.shape = shape;
  p.offset = static_cast<size_t>(numel_);
  p.kind = kind;
  p.layer = layer;
  p.logical = shape;
  // Keep each tensor 16-float aligned (64 bytes) so vector loads never straddle.
  numel_ += (shape.numel() + 15) / 16 * 16;
  index_[p.name] = static_cast<int>(infos_.size());
  infos_.push_back(std::move(p));
  return static_cast<int>(infos_.size()) - 1;
}

int ParamSet::add_shard(std::string name, Shape logical, int split_dim, const ShardRange& s, ParamKind kind,
                        int layer) {
  LNS_CHECK(s.stored >= s.size && s.size >= s.valid) << name;
  Shape local = logical;
  local.dims[split_dim] = s.stored;
  const int i = add(std::move(name), local, kind, layer);
  ParamInfo& p = infos_[i];
  p.logical = logical;
  p.split_dim = split_dim;
  p.shard_begin = s.begin;
  p.shard_valid = s.valid;
  p.shard_size = s.size;
  return i;
}

bool ParamInfo::to_logical(int64_t i, int64_t j, int64_t* li, int64_t* lj) const {
  *li = i, *lj = j;
  if (split_dim == 0) {
    *li = shard_begin + i;
    return i < shard_valid;
  }
  if (split_dim == 1) {
    *lj = shard_begin + j;
    return j < shard_valid;
  }
  return true;
}

void ParamSet::finalize(Device device) {
  LNS_CHECK(!finalized_);
  // kSlack zero floats past the end: the ZeRO collectives run in place (param_set.h).
  params_ = Buffer((numel_ + kSlack) * sizeof(float), device);
  grads_ = Buffer((numel_ + kSlack) * sizeof(float), device);
  if (device == Device::CUDA) {
    guard_device_padding(params_.view(DType::F32, Shape{kSlack}, numel_ * sizeof(float)));
    guard_device_padding(grads_.view(DType::F32, Shape{kSlack}, numel_ * sizeof(float)));
    compute_ = Buffer((numel_ + kSlack) * dtype_size(DType::BF16), device);
    guard_device_padding(compute_.view(DType::BF16, Shape{kSlack}, numel_ * dtype_size(DType::BF16)));
    host_params_ = Buffer(numel_ * sizeof(float), Device::CPU);
    host_grads_ = Buffer(numel_ * sizeof(float), Device::CPU);
    // The alignment padding after each tensor: whole-buffer ops carry its zeros along,
    // nothing may write into it (checked under the SIMT emulator).
    for (size_t i = 0; i < infos_.size(); ++i) {
      const size_t end = infos_[i].offset + infos_[i].shape.numel();
      const size_t next = i + 1 < infos_.size() ? infos_[i + 1].offset : static_cast<size_t>(numel_);
      const Shape pad{static_cast<int64_t>(next - end)};
      guard_device_padding(params_.view(DType::F32, pad, end * sizeof(float)));
      guard_device_padding(grads_.view(DType::F32, pad, end * sizeof(float)));
      guard_device_padding(compute_.view(DType::BF16, pad, end * dtype_size(DType::BF16)));
    }
  }
  finalized_ = true;
}

int ParamSet::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

Tensor ParamSet::param(int i) const {
  return params_.view(DType::F32, infos_[i].shape, infos_[i].offset * sizeof(float));
}

Tensor ParamSet::grad(int i) const {
  return grads_.view(DType::F32, infos_[i].shape, infos_[i].offset * sizeof(float));
}

Tensor ParamSet::compute(int i) const {
  if (device() == Device::CPU) return param(i);
  return compute_.view(DType::BF16, infos_[i].shape, infos_[i].offset * dtype_size(DType::BF16));
}

Tensor ParamSet::host_param(int i) const {
  if (device() == Device::CPU) return param(i);
  return host_params_.view(DType::F32, infos_[i].shape, infos_[i].offset * sizeof(float));
}

Tensor ParamSet::host_grad(int i) const {
  if (device() == Device::CPU) return grad(i);
  return host_grads_.view(DType::F32, infos_[i].shape, infos_[i].offset * sizeof(float));
}

Tensor ParamSet::flat_params_padded(int64_t n) const {
  LNS_CHECK(numel_ <= n && n <= numel_ + kSlack) << n;
  return params_.f32(Shape{n});
}

Tensor ParamSet::flat_grads_padded(int64_t n) const {
  LNS_CHECK(numel_ <= n && n <= numel_ + kSlack) << n;
  return grads_.f32(Shape{n});
}

Tensor ParamSet::flat_compute_padded(int64_t n) const {
  LNS_CHECK(numel_ <= n && n <= numel_ + kSlack) << n;
  return device() == Device::CPU ? Tensor{} : compute_.view(DType::BF16, Shape{n});
}

Tensor ParamSet::flat_compute() const {
  return device() == Device::CPU ? Tensor{} : compute_.view(DType::BF16, Shape{numel_});
}

void ParamSet::zero_grads() {
  zero_tensor(flat_grads());
}

void ParamSet::upload() {
  if (device() == Device::CPU) return;
  copy_tensor(flat_params(), host_params_.f32(Shape{numel_}));
  refresh_compute();
}

void ParamSet::download(bool grads) {
  if (device() == Device::CPU) return;
  copy_tensor(host_params_.f32(Shape{numel_}), flat_params());
  if (grads) copy_tensor(host_grads_.f32(Shape{numel_}), flat_grads());
}

void ParamSet::refresh_compute() {
  if (device() == Device::CUDA) cast(flat_compute(), flat_params());
}

}  // namespace lns
