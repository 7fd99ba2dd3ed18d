#include "parallel/nccl_communicator.h"

#include <atomic>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "lns/core/errors.h"
#include "lns/core/exit_status.h"
#include "parallel/mpi_communicator.h"

#ifdef LNS_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include "lns/core/device.h"
#endif

namespace lns {

#ifdef LNS_WITH_CUDA
namespace {

void nccl_check(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  LOG(FATAL) << "NCCL " << what << " failed: " << ncclGetErrorString(r);
}

// NCCL's work goes on the compute stream of the CUDA backend (lns/core/device.h), so that it
// is ordered with the ops; a failed CUDA call is a programmer or driver error.
cudaStream_t compute_stream() { return static_cast<cudaStream_t>(device_stream(Device::CUDA)); }
void cuda_check(cudaError_t e, const char* what, int line) {
  if (e == cudaSuccess) return;
  LOG(FATAL) << "CUDA error " << cudaGetErrorName(e) << " (" << cudaGetErrorString(e) << ") in " << what << " at "
             << __FILE__ << ":" << line;
}
#define LNS_CUDA_CHECK(expr) cuda_check((expr), #expr, __LINE__)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
  }
  return ncclUint8;
}

class NcclCommunicator : public Communicator {
 public:
  explicit NcclCommunicator(MPI_Comm comm)
      : host_(make_host_staging_communicator(make_mpi_communicator(comm))) {
    ncclUniqueId id;
    if (host_->rank() == 0) nccl_check(ncclGetUniqueId(&id), "get unique id");
    std::vector<char> bytes(reinterpret_cast<char*>(&id), reinterpret_cast<char*>(&id) + sizeof(id));
    host_->broadcast(Tensor{bytes.data(), DType::I32, Device::CPU, Shape{int64_t(sizeof(id) / 4)}}, 0);
    std::memcpy(&id, bytes.data(), sizeof(id));
    const ncclResult_t r = ncclCommInitRank(&comm_, host_->size(), id, host_->rank());
    if (r != ncclSuccess)
      fail("--comm=nccl: NCCL could not start (", ncclGetErrorString(r),
           "); ranks that share a GPU need --comm=mpi");
    // One all-reduce now, so that NCCL's connections are set up at start-up rather
    // than inside the first overlapped backward.
    float* one = nullptr;
    LNS_CUDA_CHECK(cudaMalloc(&one, sizeof(float)));
    nccl_check(ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, comm_, compute_stream()), "warm-up all-reduce");
    device_synchronize(Device::CUDA);
    LNS_CUDA_CHECK(cudaFree(one));
    add_device_sync_watch(Device::CUDA, &NcclCommunicator::watch, this);
  }
  ~NcclCommunicator() override {
    remove_device_sync_watch(Device::CUDA, this);
    if (comm_ && !aborted_) ncclCommDestroy(comm_);
    if (side_) {
      cudaEventDestroy(ready_);
      cudaEventDestroy(done_);
      cudaStreamDestroy(side_);
    }
  }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  bool overlaps_compute() const override { return true; }

  // Called while the host waits for the GPU (device_synchronize), and before every
  // call: a collective whose peer died or whose link broke never finishes, and NCCL
  // reports it here. Abort the communicator (its kernels return) and end the job with
  // the fault's status instead of hanging; after the watchdog aborted it (a hang), say so.
  static void watch(void* self) { static_cast<NcclCommunicator*>(self)->check_alive(); }
  void check_alive() {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (aborted_)
      throw FaultError(kExitHang, absl::StrCat("NCCL: the watchdog aborted the communicator of rank ", rank(), " of ",
                                               size(), "; its stuck collective returned, ending the job"));
    ncclResult_t async = ncclSuccess;
    if (!comm_ || ncclCommGetAsyncError(comm_, &async) != ncclSuccess) return;
    if (async == ncclSuccess || async == ncclInProgress) return;
    ncclCommAbort(comm_);
    aborted_ = true;
    throw FaultError(kExitCommFault, absl::StrCat("NCCL: a collective failed on rank ", rank(), " of ", size(), " (",
                                                  ncclGetErrorString(async), "): a peer process or the network ",
                                                  "failed; stopping instead of waiting for it"));
  }
  // The watchdog's thread, on a hang: frees the kernels stuck in this communicator.
  void abort() override {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (aborted_ || !comm_) return;
    aborted_ = true;
    ncclCommAbort(comm_);
  }
  std::string async_error() override {
    std::lock_guard<std::mutex> lock(abort_mu_);
    ncclResult_t async = ncclSuccess;
    if (aborted_ || !comm_ || ncclCommGetAsyncError(comm_, &async) != ncclSuccess) return "";
    if (async == ncclSuccess || async == ncclInProgress) return "";
    return absl::StrCat("NCCL reports ", ncclGetErrorString(async), " on rank ", rank(), " of ", size());
  }

  void all_reduce(Tensor t, ReduceOp op) override {
    if (t.device == Device::CPU) return host_->all_reduce(t, op);
    if (size() == 1) return;
    check_alive();
    nccl_check(ncclAllReduce(t.data, t.data, t.numel(), nccl_type(t.dtype),
                             op == ReduceOp::Sum ? ncclSum : ncclMax, comm_, compute_stream()),
               "all-reduce");
  }
  void all_reduce(double* v, int n, ReduceOp op) override { host_->all_reduce(v, n, op); }
  // Overlap: the sum runs on a side stream once the compute stream has produced its
  // input; the compute stream goes on with the rest of backward meanwhile.
  void all_reduce_start(Tensor t) override {
    if (t.device == Device::CPU || size() == 1) return all_reduce(t, ReduceOp::Sum);
    side_after_compute();
    check_alive();
    nccl_check(ncclAllReduce(t.data, t.data, t.numel(), nccl_type(t.dtype), ncclSum, comm_, side_),
               "all-reduce (overlapped)");
    pending_ = true;
  }
  void reduce(Tensor t, int root) override {
    if (t.device == Device::CPU) return host_->reduce(t, root);
    if (size() == 1) return;
    check_alive();
    nccl_check(ncclReduce(t.data, t.data, t.numel(), nccl_type(t.dtype), ncclSum, root, comm_, compute_stream()),
               "reduce");
  }
  // As all_reduce_start: on the side stream once the compute stream has produced `t`.
  void reduce_start(Tensor t, int root) override {
    if (t.device == Device::CPU || size() == 1) return reduce(t, root);
    side_after_compute();
    check_alive();
    nccl_check(ncclReduce(t.data, t.data, t.numel(), nccl_type(t.dtype), ncclSum, root, comm_, side_),
               "reduce (overlapped)");
    pending_ = true;
  }
  void all_reduce_wait() override {
    if (!pending_) return;
    LNS_CUDA_CHECK(cudaEventRecord(done_, side_));
    LNS_CUDA_CHECK(cudaStreamWaitEvent(compute_stream(), done_, 0));
    pending_ = false;
  }
  void all_gather(Tensor out, Tensor in) override {
    if (in.device == Device::CPU) return host_->all_gather(out, in);
    LNS_CHECK(out.numel() == in.numel() * size() && out.dtype == in.dtype);
    check_alive();
    nccl_check(ncclAllGather(in.data, out.data, in.numel(), nccl_type(in.dtype), comm_, compute_stream()),
               "all-gather");
  }
  void reduce_scatter(Tensor out, Tensor in) override {
    if (in.device == Device::CPU) return host_->reduce_scatter(out, in);
    LNS_CHECK(in.numel() == out.numel() * size() && out.dtype == in.dtype);
    check_alive();
    nccl_check(ncclReduceScatter(in.data, out.data, out.numel(), nccl_type(in.dtype), ncclSum, comm_,
                                 compute_stream()),
               "reduce-scatter");
  }
  void broadcast(Tensor t, int root) override {
    if (t.device == Device::CPU) return host_->broadcast(t, root);
    check_alive();
    nccl_check(ncclBroadcast(t.data, t.data, t.nbytes(), ncclUint8, root, comm_, compute_stream()),
               "broadcast");
  }
  void send(Tensor t, int peer, int tag) override { host_->send(t, peer, tag); }
  void recv(Tensor t, int peer, int tag) override { host_->recv(t, peer, tag); }
  void wait_sends() override { host_->wait_sends(); }
  void barrier() override { host_->barrier(); }
  std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine) override {
    return host_->gather_bytes(mine);
  }

 private:
  // The side stream (made on first use) waits for the work queued so far on the compute stream.
  void side_after_compute() {
    if (!side_) {
      LNS_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
      LNS_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
      LNS_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    }
    LNS_CUDA_CHECK(cudaEventRecord(ready_, compute_stream()));
    LNS_CUDA_CHECK(cudaStreamWaitEvent(side_, ready_, 0));
  }

  std::unique_ptr<Communicator> host_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t side_ = nullptr;  // overlapped all-reduces
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  bool pending_ = false;
  std::mutex abort_mu_;  // the watchdog's thread aborts; the main thread checks and uses comm_
  bool aborted_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm) {
  return std::make_unique<NcclCommunicator>(comm);
}

#else

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm) {
  fail("--comm=nccl needs a build with CUDA (configure with -DLNS_CUDA=ON)");
}

#endif

}  // namespace lns
