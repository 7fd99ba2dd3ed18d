// The byte counter of the communicators: a wrapper that counts each call's bytes by
// the ring model of CommCounts (parallel/communicator.h) and passes the call on.
#include "parallel/communicator.h"

namespace lns {

const char* collective_name(Collective k) {
  switch (k) {
    case Collective::AllReduce: return "all_reduce";
    case Collective::AllGather: return "all_gather";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::Broadcast: return "broadcast";
    case Collective::Send: return "send";
    case Collective::Reduce: return "reduce";
    case Collective::kCount: break;
  }
  return "?";
}

double CommCounts::total_bytes() const {
  double s = 0;
  for (double b : bytes) s += b;
  return s;
}

CommCounts& CommCounts::operator+=(const CommCounts& o) {
  for (int k = 0; k < kKinds; ++k) calls[k] += o.calls[k], bytes[k] += o.bytes[k];
  return *this;
}

CommCounts CommCounts::operator-(const CommCounts& o) const {
  CommCounts d = *this;
  for (int k = 0; k < kKinds; ++k) d.calls[k] -= o.calls[k], d.bytes[k] -= o.bytes[k];
  return d;
}

namespace {

class CountingCommunicator : public Communicator {
 public:
  explicit CountingCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

  void all_reduce(Tensor t, ReduceOp op) override {
    count(Collective::AllReduce, 2.0 * t.nbytes());
    inner_->all_reduce(t, op);
  }
  void all_reduce(double* v, int n, ReduceOp op) override {
    count(Collective::AllReduce, 2.0 * n * sizeof(double));
    inner_->all_reduce(v, n, op);
  }
  void all_gather(Tensor out, Tensor in) override {
    count(Collective::AllGather, out.nbytes());
    inner_->all_gather(out, in);
  }
  void reduce_scatter(Tensor out, Tensor in) override {
    count(Collective::ReduceScatter, in.nbytes());
    inner_->reduce_scatter(out, in);
  }
  void broadcast(Tensor t, int root) override {
    count(Collective::Broadcast, t.nbytes());
    inner_->broadcast(t, root);
  }
  void reduce(Tensor t, int root) override {
    count(Collective::Reduce, t.nbytes());
    inner_->reduce(t, root);
  }
  void reduce_start(Tensor t, int root) override {
    count(Collective::Reduce, t.nbytes());
    inner_->reduce_start(t, root);
  }
  void all_reduce_start(Tensor t) override {
    count(Collective::AllReduce, 2.0 * t.nbytes());
    inner_->all_reduce_start(t);
  }
  void all_reduce_wait() override { inner_->all_reduce_wait(); }
  bool overlaps_compute() const override { return inner_->overlaps_compute(); }
  void send(Tensor t, int peer, int tag) override {
    const int k = static_cast<int>(Collective::Send);
    counts_.calls[k] += 1;
    counts_.bytes[k] += double(t.nbytes());  // point to point: exactly what goes out
    inner_->send(t, peer, tag);
  }
  void recv(Tensor t, int peer, int tag) override { inner_->recv(t, peer, tag); }
  void wait_sends() override { inner_->wait_sends(); }
  void barrier() override { inner_->barrier(); }
  std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine) override {
    return inner_->gather_bytes(mine);
  }
  CommCounts counts() const override { return counts_; }

 private:
  // A collective over p ranks of a buffer whose ring traffic is `s` bytes per rank
  // at p -> infinity: each rank sends (p-1)/p of it. Nothing moves on one rank.
  void count(Collective kind, double s) {
    const int p = size();
    if (p <= 1) return;
    const int k = static_cast<int>(kind);
    counts_.calls[k] += 1;
    counts_.bytes[k] += s * (p - 1) / p;
  }

  std::unique_ptr<Communicator> inner_;
  CommCounts counts_;
};

}  // namespace

std::unique_ptr<Communicator> make_counting_communicator(std::unique_ptr<Communicator> inner) {
  return std::make_unique<CountingCommunicator>(std::move(inner));
}

}  // namespace lns
