#include "parallel/mpi_communicator.h"

#include <cstring>

#include "lns/core/errors.h"

namespace lns {
namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  LOG(FATAL) << "MPI " << what << " failed: " << std::string(msg, len);
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::I32: return MPI_INT;
    case DType::BF16: return MPI_UINT16_T;  // moved, never reduced on the host
  }
  return MPI_BYTE;
}

class MpiCommunicator : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Reduce to rank 0, then broadcast: every rank gets the same bits (an all-reduce
  // algorithm may associate the sum differently on different ranks).
  void all_reduce(Tensor t, ReduceOp op) override {
    if (size_ == 1) return;
    LNS_CHECK(t.dtype != DType::BF16);
    const MPI_Op mop = op == ReduceOp::Sum ? MPI_SUM : MPI_MAX;
    const int n = static_cast<int>(t.numel());
    check(MPI_Reduce(rank_ == 0 ? MPI_IN_PLACE : t.data, t.data, n, mpi_type(t.dtype), mop, 0, comm_),
          "reduce");
    check(MPI_Bcast(t.data, n, mpi_type(t.dtype), 0, comm_), "broadcast");
  }
  void all_reduce(double* v, int n, ReduceOp op) override {
    if (size_ == 1) return;
    const MPI_Op mop = op == ReduceOp::Sum ? MPI_SUM : MPI_MAX;
    check(MPI_Reduce(rank_ == 0 ? MPI_IN_PLACE : v, v, n, MPI_DOUBLE, mop, 0, comm_), "reduce");
    check(MPI_Bcast(v, n, MPI_DOUBLE, 0, comm_), "broadcast");
  }
  void all_gather(Tensor out, Tensor in) override {
    LNS_CHECK(out.numel() == in.numel() * size_ && out.dtype == in.dtype);
    // In place (this rank's part already where the result puts it): MPI_IN_PLACE, as
    // MPI forbids a send buffer inside the receive buffer.
    const bool in_place = in.data == static_cast<char*>(out.data) + rank_ * in.nbytes();
    check(MPI_Allgather(in_place ? MPI_IN_PLACE : in.data, static_cast<int>(in.numel()), mpi_type(in.dtype),
                        out.data, static_cast<int>(in.numel()), mpi_type(in.dtype), comm_),
          "all-gather");
  }
  void reduce_scatter(Tensor out, Tensor in) override {
    LNS_CHECK(in.numel() == out.numel() * size_ && out.dtype == DType::F32);
    // Reduce to rank 0 then scatter, for the same cross-rank determinism as all_reduce.
    // `out` may lie inside `in` (in place): the reduce has read `in` before the scatter writes.
    if (rank_ == 0) full_.resize(in.numel());  // grown once, reused every step
    std::vector<float>& full = full_;
    check(MPI_Reduce(in.data, rank_ == 0 ? full.data() : nullptr, static_cast<int>(in.numel()),
                     MPI_FLOAT, MPI_SUM, 0, comm_),
          "reduce");
    check(MPI_Scatter(full.data(), static_cast<int>(out.numel()), MPI_FLOAT, out.data,
                      static_cast<int>(out.numel()), MPI_FLOAT, 0, comm_),
          "scatter");
  }
  // The reduction all_reduce does, to `root` instead of rank 0, without the broadcast.
  void reduce(Tensor t, int root) override {
    if (size_ == 1) return;
    LNS_CHECK(t.dtype == DType::F32 && root >= 0 && root < size_);
    check(MPI_Reduce(rank_ == root ? MPI_IN_PLACE : t.data, t.data, static_cast<int>(t.numel()), MPI_FLOAT, MPI_SUM,
                     root, comm_),
          "reduce");
  }
  void broadcast(Tensor t, int root) override {
    check(MPI_Bcast(t.data, static_cast<int>(t.nbytes()), MPI_BYTE, root, comm_), "broadcast");
  }
  void send(Tensor t, int peer, int tag) override {
    MPI_Request r;
    check(MPI_Isend(t.data, static_cast<int>(t.nbytes()), MPI_BYTE, peer, tag, comm_, &r), "send");
    pending_.push_back(r);
  }
  void recv(Tensor t, int peer, int tag) override {
    check(MPI_Recv(t.data, static_cast<int>(t.nbytes()), MPI_BYTE, peer, tag, comm_,
                   MPI_STATUS_IGNORE),
          "recv");
  }
  void wait_sends() override {
    if (pending_.empty()) return;
    check(MPI_Waitall(static_cast<int>(pending_.size()), pending_.data(), MPI_STATUSES_IGNORE),
          "wait");
    pending_.clear();
  }
  void barrier() override { check(MPI_Barrier(comm_), "barrier"); }
  std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine) override {
    int n = static_cast<int>(mine.size());
    std::vector<int> sizes(size_), displs(size_);
    check(MPI_Gather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, comm_), "gather");
    std::vector<char> all;
    if (rank_ == 0) {
      int off = 0;
      for (int r = 0; r < size_; ++r) displs[r] = off, off += sizes[r];
      all.resize(off);
    }
    check(MPI_Gatherv(mine.data(), n, MPI_BYTE, all.data(), sizes.data(), displs.data(), MPI_BYTE, 0,
                      comm_),
          "gatherv");
    std::vector<std::vector<char>> out;
    if (rank_ == 0)
      for (int r = 0; r < size_; ++r)
        out.emplace_back(all.begin() + displs[r], all.begin() + displs[r] + sizes[r]);
    return out;
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::vector<MPI_Request> pending_;
  std::vector<float> full_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm) {
  return std::make_unique<MpiCommunicator>(comm);
}

}  // namespace lns
