#include <deque>

#include "lns/core/bf16.h"
#include "lns/core/device.h"
#include "lns/core/errors.h"
#include "parallel/communicator.h"

namespace lns {
namespace {

// A host copy of a tensor for the inner communicator. bf16 becomes f32 when the
// operation reduces (MPI has no bf16 arithmetic); otherwise bytes are moved as they are.
struct HostCopy {
  Tensor device;
  std::vector<char> bytes;
  Tensor host;
  HostCopy(Tensor t, bool widen_bf16) : device(t) {
    const bool widen = widen_bf16 && t.dtype == DType::BF16;
    host = t;
    host.device = Device::CPU;
    if (widen) host.dtype = DType::F32;
    bytes.resize(host.nbytes());
    host.data = bytes.data();
  }
  void pull() {  // device -> host
    if (host.dtype == device.dtype) {
      copy_tensor(host, device);
      return;
    }
    const std::vector<float> f = to_host_f32(device);
    std::copy(f.begin(), f.end(), static_cast<float*>(host.data));
  }
  void push() {  // host -> device
    if (host.dtype == device.dtype) {
      copy_tensor(device, host);
      return;
    }
    std::vector<uint16_t> b(host.numel());
    const float* f = static_cast<const float*>(host.data);
    for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(f[i]);
    copy_tensor(device, Tensor{b.data(), DType::BF16, Device::CPU, device.shape});
  }
};

class HostStagingCommunicator : public Communicator {
 public:
  explicit HostStagingCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

  void all_reduce(Tensor t, ReduceOp op) override {
    if (t.device == Device::CPU || size() == 1) return inner_->all_reduce(t, op);
    HostCopy h(t, /*widen_bf16=*/true);
    h.pull();
    inner_->all_reduce(h.host, op);
    h.push();
  }
  void all_reduce(double* v, int n, ReduceOp op) override { inner_->all_reduce(v, n, op); }
  void all_gather(Tensor out, Tensor in) override {
    if (out.device == Device::CPU && in.device == Device::CPU) return inner_->all_gather(out, in);
    HostCopy ho(out, false), hi(in, false);
    hi.pull();
    inner_->all_gather(ho.host, hi.host);
    ho.push();
  }
  void reduce_scatter(Tensor out, Tensor in) override {
    if (out.device == Device::CPU && in.device == Device::CPU) return inner_->reduce_scatter(out, in);
    HostCopy ho(out, true), hi(in, true);
    hi.pull();
    inner_->reduce_scatter(ho.host, hi.host);
    ho.push();
  }
  void reduce(Tensor t, int root) override {
    if (t.device == Device::CPU || size() == 1) return inner_->reduce(t, root);
    HostCopy h(t, /*widen_bf16=*/true);
    h.pull();
    inner_->reduce(h.host, root);
    if (rank() == root) h.push();  // the others' t is only read
  }
  void broadcast(Tensor t, int root) override {
    if (t.device == Device::CPU) return inner_->broadcast(t, root);
    HostCopy h(t, false);
    if (rank() == root) h.pull();
    inner_->broadcast(h.host, root);
    h.push();
  }
  void send(Tensor t, int peer, int tag) override {
    if (t.device == Device::CPU) return inner_->send(t, peer, tag);
    sends_.emplace_back(t, false);  // kept until wait_sends(): the send reads it
    sends_.back().pull();
    inner_->send(sends_.back().host, peer, tag);
  }
  void recv(Tensor t, int peer, int tag) override {
    if (t.device == Device::CPU) return inner_->recv(t, peer, tag);
    HostCopy h(t, false);
    inner_->recv(h.host, peer, tag);
    h.push();
  }
  void wait_sends() override {
    inner_->wait_sends();
    sends_.clear();
  }
  void barrier() override { inner_->barrier(); }
  std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine) override {
    return inner_->gather_bytes(mine);
  }

 private:
  std::unique_ptr<Communicator> inner_;
  std::deque<HostCopy> sends_;  // deque: growing it never moves the buffers in flight
};

}  // namespace

std::unique_ptr<Communicator> make_host_staging_communicator(std::unique_ptr<Communicator> inner) {
  return std::make_unique<HostStagingCommunicator>(std::move(inner));
}

CommKind parse_comm(const std::string& value) {
  if (value == "mpi") return CommKind::Mpi;
  if (value == "nccl") return CommKind::Nccl;
  fail("--comm must be nccl or mpi, got '", value, "'");
}

}  // namespace lns
