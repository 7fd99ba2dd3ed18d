// The byte counter of the communicators: a wrapper that counts each call's bytes by
// the ring model of CommCounts (parallel/communicator.h), records the call in flight
// (CommActivity: the watchdog's report, the stragglers' wait time) and passes it on.
#include "parallel/comm_activity.h"
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

// While alive, the call is the process's operation in flight (CommActivity).
class InFlight {
 public:
  InFlight(const std::string& group, const char* kind, int size, int64_t bytes, int peer = -1) {
    CommOp op;
    op.group = group, op.kind = kind, op.peer = peer, op.group_size = size, op.bytes = bytes;
    CommActivity::process().begin(std::move(op));
  }
  ~InFlight() { CommActivity::process().end(); }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
};

class CountingCommunicator : public Communicator {
 public:
  CountingCommunicator(std::unique_ptr<Communicator> inner, std::string group)
      : inner_(std::move(inner)), group_(std::move(group)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

  void all_reduce(Tensor t, ReduceOp op) override {
    count(Collective::AllReduce, 2.0 * t.nbytes());
    InFlight f(group_, "all_reduce", size(), t.nbytes());
    inner_->all_reduce(t, op);
  }
  void all_reduce(double* v, int n, ReduceOp op) override {
    count(Collective::AllReduce, 2.0 * n * sizeof(double));
    InFlight f(group_, "all_reduce", size(), int64_t(n) * 8);
    inner_->all_reduce(v, n, op);
  }
  void all_gather(Tensor out, Tensor in) override {
    count(Collective::AllGather, out.nbytes());
    InFlight f(group_, "all_gather", size(), out.nbytes());
    inner_->all_gather(out, in);
  }
  void reduce_scatter(Tensor out, Tensor in) override {
    count(Collective::ReduceScatter, in.nbytes());
    InFlight f(group_, "reduce_scatter", size(), in.nbytes());
    inner_->reduce_scatter(out, in);
  }
  void broadcast(Tensor t, int root) override {
    count(Collective::Broadcast, t.nbytes());
    InFlight f(group_, "broadcast", size(), t.nbytes());
    inner_->broadcast(t, root);
  }
  void reduce(Tensor t, int root) override {
    count(Collective::Reduce, t.nbytes());
    InFlight f(group_, "reduce", size(), t.nbytes());
    inner_->reduce(t, root);
  }
  void reduce_start(Tensor t, int root) override {
    count(Collective::Reduce, t.nbytes());
    InFlight f(group_, "reduce", size(), t.nbytes());
    inner_->reduce_start(t, root);
  }
  void all_reduce_start(Tensor t) override {
    count(Collective::AllReduce, 2.0 * t.nbytes());
    InFlight f(group_, "all_reduce", size(), t.nbytes());
    inner_->all_reduce_start(t);
  }
  void all_reduce_wait() override {
    InFlight f(group_, "all_reduce_wait", size(), 0);
    inner_->all_reduce_wait();
  }
  bool overlaps_compute() const override { return inner_->overlaps_compute(); }
  void send(Tensor t, int peer, int tag) override {
    const int k = static_cast<int>(Collective::Send);
    counts_.calls[k] += 1;
    counts_.bytes[k] += double(t.nbytes());  // point to point: exactly what goes out
    InFlight f(group_, "send", size(), t.nbytes(), peer);
    inner_->send(t, peer, tag);
  }
  void recv(Tensor t, int peer, int tag) override {
    InFlight f(group_, "recv", size(), t.nbytes(), peer);
    inner_->recv(t, peer, tag);
  }
  void wait_sends() override {
    InFlight f(group_, "wait_sends", size(), 0);
    inner_->wait_sends();
  }
  void barrier() override {
    InFlight f(group_, "barrier", size(), 0);
    inner_->barrier();
  }
  std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine) override {
    InFlight f(group_, "gather_bytes", size(), static_cast<int64_t>(mine.size()));
    return inner_->gather_bytes(mine);
  }
  CommCounts counts() const override { return counts_; }
  void abort() override { inner_->abort(); }
  std::string async_error() override { return inner_->async_error(); }

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
  std::string group_;
  CommCounts counts_;
};

}  // namespace

std::unique_ptr<Communicator> make_counting_communicator(std::unique_ptr<Communicator> inner,
                                                         const std::string& group) {
  return std::make_unique<CountingCommunicator>(std::move(inner), group);
}

}  // namespace lns
