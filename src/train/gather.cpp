#include "lns/train/gather.h"

#include <cstring>

#include "lns/core/errors.h"

namespace lns {
namespace {

template <typename T>
void put(std::vector<char>& b, const T& v) {
  const char* p = reinterpret_cast<const char*>(&v);
  b.insert(b.end(), p, p + sizeof(T));
}

template <typename T>
T take(const std::vector<char>& b, size_t& at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof(T));
  at += sizeof(T);
  return v;
}

// Visits every element of the `valid` box of a row-major tensor of shape `shape`,
// calling f(linear index in `shape`, multi-index).
template <typename F>
void for_each_in_box(const Shape& shape, const Shape& valid, F&& f) {
  std::array<int64_t, kMaxDims> idx{};
  const int64_t total = valid.numel();
  for (int64_t k = 0; k < total; ++k) {
    int64_t rem = k, lin = 0;
    for (int d = valid.ndim - 1; d >= 0; --d) idx[d] = rem % valid[d], rem /= valid[d];
    for (int d = 0; d < shape.ndim; ++d) lin = lin * shape[d] + idx[d];
    f(lin, idx);
  }
}

}  // namespace

bool param_piece(const ParamSet& params, int i, bool grads, int tp_rank, TensorPiece* out) {
  const ParamInfo& p = params.info(i);
  if (!p.counted_on(tp_rank)) return false;
  out->name = p.name;
  out->logical = p.logical;
  out->offset = {};
  out->valid = p.shape;
  if (!p.replicated()) {
    out->offset[p.split_dim] = p.shard_begin;
    out->valid.dims[p.split_dim] = p.shard_valid;
  }
  out->local = grads ? params.host_grad(i) : params.host_param(i);  // download() first on CUDA
  return true;
}

std::map<std::string, OwnedTensor> gather_to_root(Communicator& world,
                                                  const std::vector<TensorPiece>& mine) {
  // Serialise: name, dtype, logical shape, offset, valid extent, then the valid box.
  std::vector<char> buf;
  put<int32_t>(buf, static_cast<int32_t>(mine.size()));
  for (const TensorPiece& p : mine) {
    put<int32_t>(buf, static_cast<int32_t>(p.name.size()));
    buf.insert(buf.end(), p.name.begin(), p.name.end());
    put<int32_t>(buf, static_cast<int32_t>(p.local.dtype));
    put<int32_t>(buf, p.logical.ndim);
    for (int d = 0; d < p.logical.ndim; ++d) put(buf, p.logical[d]);
    for (int d = 0; d < p.logical.ndim; ++d) put(buf, p.offset[d]);
    for (int d = 0; d < p.logical.ndim; ++d) put(buf, p.valid[d]);
    const size_t es = dtype_size(p.local.dtype);
    for_each_in_box(p.local.shape, p.valid, [&](int64_t lin, const auto&) {
      const char* src = static_cast<const char*>(p.local.data) + lin * es;
      buf.insert(buf.end(), src, src + es);
    });
  }
  std::map<std::string, OwnedTensor> out;
  for (const std::vector<char>& b : world.gather_bytes(buf)) {
    size_t at = 0;
    const int32_t count = take<int32_t>(b, at);
    for (int32_t k = 0; k < count; ++k) {
      const int32_t len = take<int32_t>(b, at);
      const std::string name(b.data() + at, len);
      at += len;
      const auto dtype = static_cast<DType>(take<int32_t>(b, at));
      Shape logical, valid;
      std::array<int64_t, kMaxDims> offset{};
      logical.ndim = valid.ndim = take<int32_t>(b, at);
      for (int d = 0; d < logical.ndim; ++d) logical.dims[d] = take<int64_t>(b, at);
      for (int d = 0; d < logical.ndim; ++d) offset[d] = take<int64_t>(b, at);
      for (int d = 0; d < logical.ndim; ++d) valid.dims[d] = take<int64_t>(b, at);
      auto it = out.find(name);
      if (it == out.end()) it = out.emplace(name, OwnedTensor(dtype, logical)).first;
      LNS_CHECK(it->second.t.shape == logical) << name;
      const size_t es = dtype_size(dtype);
      char* dst = static_cast<char*>(it->second.t.data);
      for_each_in_box(valid, valid, [&](int64_t, const auto& idx) {
        int64_t lin = 0;
        for (int d = 0; d < logical.ndim; ++d) lin = lin * logical[d] + offset[d] + idx[d];
        std::memcpy(dst + lin * es, b.data() + at, es);
        at += es;
      });
    }
  }
  return out;
}

}  // namespace lns
