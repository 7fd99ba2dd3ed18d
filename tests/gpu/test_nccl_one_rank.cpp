// NCCL's collectives at a world of one rank (issue 29): NCCL refuses two ranks on one
// GPU, and a one-rank communicator of the project (NcclCommunicator) skips NCCL
// altogether, so on a machine with one GPU nothing else calls NCCL. This test does,
// for real: every collective the trainer uses, out of place into destinations filled
// with NaN bytes first (a collective that moved nothing leaves NaN), and in place.
// One rank's sum, max, scatter and gather of x are x. Run as
//   mpirun -np 1 lns_mpi_tests --device=cuda --comm=nccl --gtest_filter=NcclOneRank.*
// (ctest gpu_nccl_one_rank; under the emulator the NCCL stand-in runs it).
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "lns/core/device.h"
#include "lns/train/train_flags.h"

namespace lns {
namespace {

#define NCCL_OK(x) ASSERT_EQ((x), ncclSuccess) << #x
#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

TEST(NcclOneRank, EveryCollectiveMovesTheBytesOnTheDevice) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (comm_flag() != CommKind::Nccl || cuda_device_count() == 0 || world != 1)
    GTEST_SKIP() << "runs on one rank with --device=cuda --comm=nccl";
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  ncclComm_t comm = nullptr;
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t n = 1000;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = 0.25f * float(i) - 17.0f;
  float *in = nullptr, *out = nullptr;
  CUDA_OK(cudaMalloc(&in, n * 4));
  CUDA_OK(cudaMalloc(&out, n * 4));
  CUDA_OK(cudaMemcpy(in, x.data(), n * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize());
  // Runs `call` on `s` after filling `out` with NaN bytes; `dst` must then hold x.
  auto check = [&](const char* what, float* dst, auto call) {
    CUDA_OK(cudaMemsetAsync(out, 0xff, n * 4, s));
    NCCL_OK(call());
    std::vector<float> got(n);
    CUDA_OK(cudaMemcpyAsync(got.data(), dst, n * 4, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    EXPECT_EQ(0, std::memcmp(got.data(), x.data(), n * 4)) << what << ": element 7 is " << got[7];
  };
  check("all-reduce sum", out, [&] { return ncclAllReduce(in, out, n, ncclFloat32, ncclSum, comm, s); });
  check("all-reduce max, in place", in, [&] { return ncclAllReduce(in, in, n, ncclFloat32, ncclMax, comm, s); });
  check("reduce-scatter", out, [&] { return ncclReduceScatter(in, out, n, ncclFloat32, ncclSum, comm, s); });
  check("all-gather", out, [&] { return ncclAllGather(in, out, n, ncclFloat32, comm, s); });
  check("reduce to root 0", out, [&] { return ncclReduce(in, out, n, ncclFloat32, ncclSum, 0, comm, s); });
  check("broadcast of bytes", out, [&] { return ncclBroadcast(in, out, n * 4, ncclUint8, 0, comm, s); });
  CUDA_OK(cudaFree(in));
  CUDA_OK(cudaFree(out));
  CUDA_OK(cudaStreamDestroy(s));
  NCCL_OK(ncclCommDestroy(comm));
}

}  // namespace
}  // namespace lns
