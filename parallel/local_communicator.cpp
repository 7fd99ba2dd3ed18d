#include <cstring>

#include "lns/core/device.h"
#include "lns/core/errors.h"
#include "parallel/communicator.h"

namespace lns {
namespace {

class LocalCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce(Tensor, ReduceOp) override {}
  void all_reduce(double*, int, ReduceOp) override {}
  void all_gather(Tensor out, Tensor in) override {
    LNS_CHECK(out.nbytes() == in.nbytes());
    copy_tensor(out.view(in.shape), in);  // host or device
  }
  void reduce_scatter(Tensor out, Tensor in) override { all_gather(out, in); }
  void broadcast(Tensor, int) override {}
  void reduce(Tensor, int) override {}
  void send(Tensor, int, int) override { LOG(FATAL) << "send on a one-rank communicator"; }
  void recv(Tensor, int, int) override { LOG(FATAL) << "recv on a one-rank communicator"; }
  void wait_sends() override {}
  void barrier() override {}
  std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine) override { return {mine}; }
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }

}  // namespace lns
