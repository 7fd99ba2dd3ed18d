// The NCCL stand-in (src/cuda/sim/nccl.cpp) under mpirun -np 2 / 4, one emulated
// device per rank: each collective as parallel/nccl_communicator.cpp calls it, against
// the MPI communicator's result for the same data; communicators of sub-groups and
// several per rank; NCCL's duplicate-GPU refusal. `--break=<case>` runs one
// deliberately broken call instead, which must be reported (ctest matches the line).
#include <gtest/gtest.h>
#include <mpi.h>
#include <nccl.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lns/core/bf16.h"
#include "parallel/mpi_communicator.h"
#include "tests/sim/device_mem.h"

#ifdef LNS_CUDA_SIM
#include <cuda_runtime.h>
#endif

namespace {

int g_rank = 0, g_size = 1;

struct DevBuf {
  void* p;
  size_t bytes;
  explicit DevBuf(size_t b) : p(lns::simtest::device_alloc(b)), bytes(b) {}
  ~DevBuf() { lns::simtest::device_free(p); }
  template <class T>
  void put(const std::vector<T>& v) { lns::simtest::upload(p, v.data(), v.size() * sizeof(T)); }
  template <class T>
  std::vector<T> get() const {
    std::vector<T> v(bytes / sizeof(T));
    lns::simtest::download(v.data(), p, bytes);
    return v;
  }
  char* at(size_t off) const { return static_cast<char*>(p) + off; }
};

// The members of `group` form one NCCL communicator; its rank 0 makes the id.
ncclComm_t make_comm(MPI_Comm group) {
  int r = 0, n = 1;
  MPI_Comm_rank(group, &r), MPI_Comm_size(group, &n);
  ncclUniqueId id;
  if (r == 0) {
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  }
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, group);
  ncclComm_t c = nullptr;
  EXPECT_EQ(ncclCommInitRank(&c, n, id, r), ncclSuccess);
  return c;
}

std::vector<float> random_f32(size_t n, unsigned salt) {
  std::mt19937 rng(1000 * g_rank + salt);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

lns::Tensor host(void* p, lns::DType t, int64_t n) { return lns::Tensor{p, t, lns::Device::CPU, lns::Shape{n}}; }

struct Fixture : testing::Test {
  std::unique_ptr<lns::Communicator> mpi = lns::make_mpi_communicator(MPI_COMM_WORLD);
  ncclComm_t comm = make_comm(MPI_COMM_WORLD);
  ~Fixture() override { ncclCommDestroy(comm); }
};

using SimNccl = Fixture;

TEST_F(SimNccl, AllReduceSumF32InAndOutOfPlace) {
  const size_t n = 1000;
  const auto x = random_f32(n, 1);
  auto want = x;
  mpi->all_reduce(host(want.data(), lns::DType::F32, n), lns::ReduceOp::Sum);
  for (bool in_place : {false, true}) {
    DevBuf send(n * 4), recv(n * 4);
    send.put(x);
    ASSERT_EQ(ncclAllReduce(send.p, in_place ? send.p : recv.p, n, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
    if (lns::simtest::deferred_until_sync()) {
      EXPECT_EQ(send.get<float>(), x) << "ran before its stream reached it";
    }
    lns::simtest::synchronize();
    const auto got = (in_place ? send : recv).get<float>();
    for (size_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], want[i], 1e-6 * g_size) << i;
  }
}

TEST_F(SimNccl, AllReduceMaxF32AndSumI32AreExact) {
  const size_t n = 257;
  const auto x = random_f32(n, 2);
  auto want = x;
  mpi->all_reduce(host(want.data(), lns::DType::F32, n), lns::ReduceOp::Max);
  std::vector<int32_t> xi(n);
  for (size_t i = 0; i < n; ++i) xi[i] = int32_t(i) * (g_rank + 1) - 7 * g_rank;
  auto want_i = xi;
  mpi->all_reduce(host(want_i.data(), lns::DType::I32, n), lns::ReduceOp::Sum);
  DevBuf f(n * 4), k(n * 4);
  f.put(x), k.put(xi);
  ASSERT_EQ(ncclAllReduce(f.p, f.p, n, ncclFloat32, ncclMax, comm, nullptr), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(k.p, k.p, n, ncclInt32, ncclSum, comm, nullptr), ncclSuccess);
  lns::simtest::synchronize();
  EXPECT_EQ(f.get<float>(), want);
  EXPECT_EQ(k.get<int32_t>(), want_i);
}

// bf16: rounded after each combination (as NCCL's ring), so within one bf16 rounding
// per rank of the f32 sum; and the same bits on every rank.
TEST_F(SimNccl, AllReduceBf16WithinRoundingAndIdenticalOnAllRanks) {
  const size_t n = 512;
  const auto xf = random_f32(n, 3);
  std::vector<uint16_t> x(n);
  std::vector<float> as_f32(n), mag(n);
  for (size_t i = 0; i < n; ++i) x[i] = lns::f32_to_bf16(xf[i]), as_f32[i] = lns::bf16_to_f32(x[i]);
  for (size_t i = 0; i < n; ++i) mag[i] = std::fabs(as_f32[i]);
  mpi->all_reduce(host(as_f32.data(), lns::DType::F32, n), lns::ReduceOp::Sum);
  mpi->all_reduce(host(mag.data(), lns::DType::F32, n), lns::ReduceOp::Sum);
  DevBuf b(n * 2);
  b.put(x);
  ASSERT_EQ(ncclAllReduce(b.p, b.p, n, ncclBfloat16, ncclSum, comm, nullptr), ncclSuccess);
  lns::simtest::synchronize();
  const auto got = b.get<uint16_t>();
  for (size_t i = 0; i < n; ++i)
    ASSERT_NEAR(lns::bf16_to_f32(got[i]), as_f32[i], std::ldexp(mag[i], -8) * (g_size - 1) + 1e-30) << i;
  std::vector<uint16_t> first = got;
  MPI_Bcast(first.data(), int(n), MPI_UINT16_T, 0, MPI_COMM_WORLD);
  EXPECT_EQ(got, first);
}

TEST_F(SimNccl, ReduceScatterF32InAndOutOfPlace) {
  const size_t n = 100;  // per rank
  const auto x = random_f32(n * g_size, 4);
  std::vector<float> want(n), in = x;
  mpi->reduce_scatter(host(want.data(), lns::DType::F32, n), host(in.data(), lns::DType::F32, n * g_size));
  for (bool in_place : {false, true}) {
    DevBuf send(n * g_size * 4), recv(n * 4);
    send.put(x);
    void* out = in_place ? send.at(g_rank * n * 4) : recv.p;
    ASSERT_EQ(ncclReduceScatter(send.p, out, n, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
    lns::simtest::synchronize();
    std::vector<float> got(n);
    lns::simtest::download(got.data(), out, n * 4);
    for (size_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], want[i], 1e-6 * g_size) << i;
  }
}

TEST_F(SimNccl, AllGatherBf16InAndOutOfPlace) {
  const size_t n = 33;
  std::vector<uint16_t> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = uint16_t(g_rank * 1000 + i);
  std::vector<uint16_t> want(n * g_size);
  mpi->all_gather(host(want.data(), lns::DType::BF16, n * g_size), host(x.data(), lns::DType::BF16, n));
  for (bool in_place : {false, true}) {
    DevBuf send(n * 2), recv(n * g_size * 2);
    send.put(x);
    const void* src = send.p;
    if (in_place) lns::simtest::upload(recv.at(g_rank * n * 2), x.data(), n * 2), src = recv.at(g_rank * n * 2);
    ASSERT_EQ(ncclAllGather(src, recv.p, n, ncclBfloat16, comm, nullptr), ncclSuccess);
    lns::simtest::synchronize();
    EXPECT_EQ(recv.get<uint16_t>(), want);
  }
}

TEST_F(SimNccl, BroadcastBytesFromTheLastRank) {
  const int root = g_size - 1;
  const size_t n = 76;
  std::vector<uint8_t> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = uint8_t(31 * g_rank + i);
  std::vector<uint8_t> want = x;  // moved as 19 int32 by the MPI communicator
  mpi->broadcast(host(want.data(), lns::DType::I32, n / 4), root);
  DevBuf b(n);
  b.put(x);
  ASSERT_EQ(ncclBroadcast(b.p, b.p, n, ncclUint8, root, comm, nullptr), ncclSuccess);
  lns::simtest::synchronize();
  EXPECT_EQ(b.get<uint8_t>(), want);
}

// ncclReduce to every root in turn, in place (the ZeRO gradient sum): the root gets
// the MPI communicator's sum; the other ranks' buffer is left as it was.
TEST_F(SimNccl, ReduceF32InPlaceToEachRoot) {
  const size_t n = 300;
  const auto x = random_f32(n, 6);
  for (int root = 0; root < g_size; ++root) {
    auto want = x;
    mpi->reduce(host(want.data(), lns::DType::F32, n), root);
    DevBuf b(n * 4);
    b.put(x);
    ASSERT_EQ(ncclReduce(b.p, b.p, n, ncclFloat32, ncclSum, root, comm, nullptr), ncclSuccess);
    lns::simtest::synchronize();
    const auto got = b.get<float>();
    if (g_rank != root) {
      EXPECT_EQ(got, x) << "root " << root;
      continue;
    }
    float worst = 0;
    for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
    EXPECT_LE(worst, 1e-6f * g_size) << "root " << root;
    if (g_size == 2) {
      EXPECT_EQ(got, want);  // a sum of two is one rounding either way
    }
  }
}

// Communicators made as a tp x dp grid makes them (pairs {0,1},{2,3}, then strides
// {0,2},{1,3}, then the world; ids from world ranks 0, 2, 0, 1, 0), several per rank:
// each sums over its own members only.
TEST_F(SimNccl, GridOfCommunicators) {
  MPI_Comm pair, stride;
  MPI_Comm_split(MPI_COMM_WORLD, g_rank / 2, g_rank, &pair);
  MPI_Comm_split(MPI_COMM_WORLD, g_rank % 2, g_rank, &stride);
  ncclComm_t pc = make_comm(pair), sc = make_comm(stride), wc = make_comm(MPI_COMM_WORLD);
  int count = 0, r = -1;
  ASSERT_EQ(ncclCommCount(pc, &count), ncclSuccess);
  ASSERT_EQ(ncclCommUserRank(pc, &r), ncclSuccess);
  EXPECT_EQ(count, std::min(2, g_size - g_rank / 2 * 2));
  EXPECT_EQ(r, g_rank % 2);
  DevBuf a(4), b(4), w(4);
  const std::vector<float> me{float(g_rank + 1)};
  a.put(me), b.put(me), w.put(me);
  ASSERT_EQ(ncclAllReduce(a.p, a.p, 1, ncclFloat32, ncclSum, pc, nullptr), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(b.p, b.p, 1, ncclFloat32, ncclSum, sc, nullptr), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(w.p, w.p, 1, ncclFloat32, ncclSum, wc, nullptr), ncclSuccess);
  lns::simtest::synchronize();
  float pair_sum = 0, stride_sum = 0;
  for (int q = 0; q < g_size; ++q) {
    if (q / 2 == g_rank / 2) pair_sum += q + 1;
    if (q % 2 == g_rank % 2) stride_sum += q + 1;
  }
  EXPECT_EQ(a.get<float>()[0], pair_sum);
  EXPECT_EQ(b.get<float>()[0], stride_sum);
  EXPECT_EQ(w.get<float>()[0], float(g_size * (g_size + 1) / 2));
  ncclCommDestroy(pc), ncclCommDestroy(sc), ncclCommDestroy(wc);
  MPI_Comm_free(&pair), MPI_Comm_free(&stride);
}

// NCCL refuses two ranks on one GPU; the emulation does the same per (host, device).
TEST(SimNcclInit, TwoRanksOnOneDeviceIsInvalidUsage) {
  if (g_size < 2) GTEST_SKIP() << "needs 2 ranks";
  lns::simtest::set_device(0);
  ncclUniqueId id;
  if (g_rank == 0) {
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  }
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t c = nullptr;
  EXPECT_EQ(ncclCommInitRank(&c, g_size, id, g_rank), ncclInvalidUsage);
  EXPECT_EQ(c, nullptr);
  lns::simtest::set_device(g_rank);
}

// ---- deliberately broken calls (tests/sim/CMakeLists.txt: sim_nccl_break_*) -----------
int run_broken(const std::string& what) {
  ncclComm_t comm = make_comm(MPI_COMM_WORLD);
  DevBuf b(1024);
  if (what == "host_pointer") {
    std::vector<float> h(16);
    ncclAllReduce(h.data(), h.data(), 16, ncclFloat32, ncclSum, comm, nullptr);
  } else if (what == "disagree") {
    ncclAllReduce(b.p, b.p, 16 + g_rank, ncclFloat32, ncclSum, comm, nullptr);
  } else if (what == "overlap") {
    ncclAllReduce(b.p, b.at(8), 16, ncclFloat32, ncclSum, comm, nullptr);
  } else if (what == "after_destroy") {
    ncclCommDestroy(comm);
    ncclAllReduce(b.p, b.p, 16, ncclFloat32, ncclSum, comm, nullptr);
  } else if (what == "never_arrives") {  // run with LNS_SIM_NCCL_WAIT_S=2
    if (g_rank == 0) ncclAllReduce(b.p, b.p, 16, ncclFloat32, ncclSum, comm, nullptr);
    lns::simtest::synchronize();
    if (g_rank != 0) sleep(30);  // rank 0's deadline ends the run first
#ifdef LNS_CUDA_SIM
  } else if (what == "two_comms_unordered" || what == "two_comms_ordered") {
    // Two communicators, each on its own stream: the second one's all-reduce is issued
    // while the first one's may still run, which NCCL forbids unless something orders
    // them. "ordered" makes the second stream wait for the first by an event (legal:
    // it must run, and then the case reports itself as not reported on purpose).
    ncclComm_t other = make_comm(MPI_COMM_WORLD);
    DevBuf b2(1024);
    cudaStream_t s1, s2;
    cudaEvent_t done;
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    ncclAllReduce(b.p, b.p, 16, ncclFloat32, ncclSum, comm, s1);
    if (what == "two_comms_ordered") cudaEventRecord(done, s1), cudaStreamWaitEvent(s2, done, 0);
    ncclAllReduce(b2.p, b2.p, 16, ncclFloat32, ncclSum, other, s2);
    lns::simtest::synchronize();
    if (what == "two_comms_ordered") {
      std::printf("ordered collectives of two communicators ran\n");
      return 1;
    }
#endif
  } else if (what == "bucket_unwaited" || what == "bucket_overwritten" || what == "bucket_waited") {
#ifdef LNS_CUDA_SIM
    // The cross-stream race check (LNS_SIM_CHECKS=streams): backward writes a gradient
    // bucket on the compute stream and a side stream sums it (nccl_communicator.cpp's
    // overlap). Unwaited: the collective may read the bucket before it is written.
    // Overwritten: the compute stream writes the bucket again while the collective may
    // still read it. Waited: the two events that order both, which must run.
    cudaStream_t compute, side;
    cudaEvent_t ready, done;
    cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    DevBuf sum(1024);
    const bool waited = what == "bucket_waited";
    cudaMemsetAsync(b.p, 0, 1024, compute);  // "backward" writes the bucket
    if (what != "bucket_unwaited") cudaEventRecord(ready, compute), cudaStreamWaitEvent(side, ready, 0);
    ncclAllReduce(b.p, sum.p, 256, ncclFloat32, ncclSum, comm, side);
    if (waited) cudaEventRecord(done, side), cudaStreamWaitEvent(compute, done, 0);
    cudaMemsetAsync(b.p, 0, 1024, compute);  // the next micro-batch
    lns::simtest::synchronize();
    if (waited) {
      std::printf("the ordered bucket reduction ran\n");
      return 1;
    }
#endif
  } else if (what == "reduce_roots_disagree") {  // each rank names itself the root
    ncclReduce(b.p, b.p, 16, ncclFloat32, ncclSum, g_rank, comm, nullptr);
  } else if (what == "past_the_end") {
    ncclAllGather(b.p, b.p, 1024 / 4 / g_size + 1, ncclFloat32, comm, nullptr);  // recv: size * count floats
  } else {
    std::fprintf(stderr, "unknown --break=%s\n", what.c_str());
    return 2;
  }
  lns::simtest::synchronize();
  std::printf("broken call %s was NOT reported\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank), MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  lns::simtest::set_device(g_rank);  // one emulated device per rank
  int rc = 0;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--break=", 8) == 0) rc = run_broken(argv[i] + 8);
  if (rc == 0) {
    if (g_rank != 0) delete testing::UnitTest::GetInstance()->listeners().Release(
        testing::UnitTest::GetInstance()->listeners().default_result_printer());
    rc = RUN_ALL_TESTS();
    int any = 0;
    MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    rc = any;
  }
  MPI_Finalize();
  return rc;
}
