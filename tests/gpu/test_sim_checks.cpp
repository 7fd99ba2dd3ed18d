// The SIMT emulator's checks fire (label `gpu`, built only with -DLNS_CUDA_SIM=ON):
// small kernels with one deliberate bug each, every one asserted to be reported with
// the kernel, block, thread and source line (death tests), next to the same kernel
// written correctly, which must pass. The bugs are those a GPU either faults on or,
// worse, computes wrong results from without a word.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/pool.h"
#include "cuda/runtime.h"
#include "cuda/sim/counters.h"
#include "cuda/sdpa.h"
#include "cuda/sim/sim_internal.h"
#include "lns/train/trainer.h"
#include "tests/gpu/graphed_steps.h"

namespace lns::cuda {
namespace {

// Device buffer of n floats, freed at scope exit.
struct DevBuf {
  float* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) { LNS_CUDA_CHECK(cudaMalloc(&p, n * sizeof(float))); }
  ~DevBuf() { cudaFree(p); }
  std::vector<float> get() const {
    std::vector<float> h(n);
    LNS_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
  }
  // Returns when the copy is done: a cudaMemcpy from pageable memory may return while
  // its last bytes are in flight (CUDA's API sync rules), and the stream tests below
  // touch the buffer from non-blocking streams, which do not wait for the copy.
  void set(const std::vector<float>& h) {
    LNS_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    LNS_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

// Checks on for one test (the suite may run without them, LNS_SIM_CHECKS).
struct WithChecks {
  sim::Options saved = sim::options();
  WithChecks(bool reverse, bool race, bool streams = false) {
    sim::options().reverse_check = reverse, sim::options().race_check = race, sim::options().stream_check = streams;
  }
  ~WithChecks() { sim::options() = saved; }
};

// ---- a missing __syncthreads before reading shared memory ----------------------------

// out[i] = in[(i + 1) % blockDim] through shared memory             [blockDim]
__global__ void rotate_kernel(float* out, const float* in, bool sync) {
  __shared__ float buf[256];
  buf[threadIdx.x] = in[threadIdx.x];
  if (sync) __syncthreads();
  out[threadIdx.x] = buf[(threadIdx.x + 1) % blockDim.x];
}

TEST(SimChecks, MissingSyncthreadsIsCaughtByTheReversedOrderRun) {
  DevBuf in(256), out(256);
  std::vector<float> h(256);
  for (int i = 0; i < 256; ++i) h[i] = float(i);
  in.set(h);
  {
    WithChecks on(/*reverse=*/true, /*race=*/false);
    LNS_LAUNCH(rotate_kernel, 1, 256, 0, nullptr)(out.p, in.p, true);
    const std::vector<float> got = out.get();
    for (int i = 0; i < 256; ++i) ASSERT_EQ(got[i], float((i + 1) % 256));
  }
  EXPECT_DEATH(
      {
        WithChecks on(true, false);
        LNS_LAUNCH(rotate_kernel, 1, 256, 0, nullptr)(out.p, in.p, false);
        cudaDeviceSynchronize();
      },
      "kernel rotate_kernel \\(launched at .*test_sim_checks.cpp:[0-9]+\\): the result depends on the order");
}

TEST(SimChecks, SharedMemoryStartsUndefinedSoAMissingBarrierReadsNaN) {
  // Without any check mode: thread i reads buf[i + 1] before thread i + 1 wrote it and
  // sees the NaN bytes the emulator fills shared memory with at each block start.
  DevBuf in(64), out(64);
  in.set(std::vector<float>(64, 1.0f));
  WithChecks off(false, false);
  LNS_LAUNCH(rotate_kernel, 1, 64, 0, nullptr)(out.p, in.p, false);
  const std::vector<float> got = out.get();
  EXPECT_TRUE(std::isnan(got[0])) << got[0];
  EXPECT_EQ(got[63], 1.0f);  // buf[0], written by thread 0 before thread 63 ran
}

// Every thread writes the same shared word in one barrier epoch: a write-write race.
__global__ void last_writer_kernel(float* out) {
  __shared__ float winner;
  winner = float(threadIdx.x);
  __syncthreads();
  if (threadIdx.x == 0) out[0] = winner;
}

TEST(SimChecks, SharedWriteWriteRaceIsReported) {
  DevBuf out(1);
  EXPECT_DEATH(
      {
        WithChecks on(false, true);
        LNS_LAUNCH(last_writer_kernel, 1, 64, 0, nullptr)(out.p);
        cudaDeviceSynchronize();
      },
      "kernel last_writer_kernel .* block \\(0,0,0\\) thread \\(1,0,0\\): shared-memory race: thread \\(1,0,0\\) and "
      "thread \\(0,0,0\\) both wrote byte [0-3] of __shared__ winner");
}

// A __device__ helper's own static __shared__ variable: the engine cannot tell which
// kernels call the helper, so every kernel gets it refilled and watched (only other
// kernels' variables are left out: static_shared.cpp).
__device__ float* helper_slot() {
  __shared__ float slot[2];
  return slot;
}
__global__ void helper_slot_kernel(float* out, bool race) {
  float* slot = helper_slot();
  if (race || threadIdx.x == 0) slot[blockIdx.x] = float(threadIdx.x + 1);
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x * 2] = slot[0], out[blockIdx.x * 2 + 1] = slot[1];
}

TEST(SimChecks, HelperFunctionSharedIsRefilledAndWatched) {
  DevBuf out(4);
  {
    WithChecks off(false, false);
    LNS_LAUNCH(last_writer_kernel, 1, 32, 0, nullptr)(out.p);  // another kernel first: its variable is left out
    cudaDeviceSynchronize();                                   // (the emulator runs work at sync points)
  }
  {
    WithChecks on(false, true);
    LNS_LAUNCH(helper_slot_kernel, 2, 32, 0, nullptr)(out.p, false);
    const std::vector<float> got = out.get();
    EXPECT_EQ(got[0], 1.0f);
    EXPECT_TRUE(std::isnan(got[1])) << got[1];  // block 0 never wrote slot[1]
    EXPECT_TRUE(std::isnan(got[2])) << got[2];  // nor block 1 slot[0]: not block 0's value
    EXPECT_EQ(got[3], 1.0f);
  }
  EXPECT_DEATH(
      {
        WithChecks on(false, true);
        LNS_LAUNCH(helper_slot_kernel, 1, 32, 0, nullptr)(out.p, true);
        cudaDeviceSynchronize();
      },
      "shared-memory race: thread \\(1,0,0\\) and thread \\(0,0,0\\) both wrote byte [0-3] of __shared__ slot");
}

// ---- read-side races (the access hooks; the Release emulation build) -------------------

// out[i] = in[(i + shift) % blockDim] through shared memory, with or without the
// barrier between the write and the read                                 [blockDim]
__global__ void shift_kernel(float* out, const float* in, int shift, bool sync) {
  __shared__ float buf[256];
  buf[threadIdx.x] = in[threadIdx.x];
  if (sync) __syncthreads();
  out[threadIdx.x] = buf[(threadIdx.x + shift) % blockDim.x];
}
// buf[i] = 2 * buf[i + 1] in place: the second barrier (between every thread's read of
// its neighbour and its own write) is the one that is easy to forget.     [blockDim]
__global__ void neighbour_update_kernel(float* out, const float* in, bool second_sync) {
  __shared__ float buf[256];
  buf[threadIdx.x] = in[threadIdx.x];
  __syncthreads();
  const float v = buf[(threadIdx.x + 1) % blockDim.x];
  if (second_sync) __syncthreads();
  buf[threadIdx.x] = 2.0f * v;
  __syncthreads();
  out[threadIdx.x] = buf[threadIdx.x];
}

// Reads are seen only where the kernels were compiled with the access hooks.
#define LNS_NEEDS_READ_HOOKS()                                                                    \
  if (!sim::race_sees_reads())                                                                    \
  GTEST_SKIP() << "this build has no access hooks (an ASan build: GCC's -fsanitize=thread, which " \
                  "provides them, excludes -fsanitize=address); the Release emulation build runs it"

TEST(SimChecks, SharedReadAfterWriteRaceIsReported) {
  LNS_NEEDS_READ_HOOKS();
  DevBuf in(64), out(64);
  std::vector<float> h(64);
  for (int i = 0; i < 64; ++i) h[i] = float(i);
  in.set(h);
  {
    WithChecks on(/*reverse=*/false, /*race=*/true);
    LNS_LAUNCH(shift_kernel, 1, 64, 0, nullptr)(out.p, in.p, 63, true);
    const std::vector<float> got = out.get();
    for (int i = 0; i < 64; ++i) ASSERT_EQ(got[i], float((i + 63) % 64));
  }
  // Thread 1 reads buf[0], which thread 0 wrote in the same epoch. The values would
  // even come out right here (thread 0 ran first): only the race check sees it.
  EXPECT_DEATH(
      {
        WithChecks on(false, true);
        LNS_LAUNCH(shift_kernel, 1, 64, 0, nullptr)(out.p, in.p, 63, false);
        cudaDeviceSynchronize();
      },
      "kernel shift_kernel .* block \\(0,0,0\\) thread \\(1,0,0\\): shared-memory race: thread \\(1,0,0\\) read "
      "byte 0 of __shared__ buf that thread \\(0,0,0\\) wrote with no __syncthreads between them "
      "\\(the read at tests/gpu/test_sim_checks.cpp:[0-9]+.*, the write at tests/gpu/test_sim_checks.cpp:[0-9]+");
}

TEST(SimChecks, SharedWriteAfterReadRaceIsReported) {
  LNS_NEEDS_READ_HOOKS();
  DevBuf in(64), out(64);
  std::vector<float> h(64);
  for (int i = 0; i < 64; ++i) h[i] = float(i);
  in.set(h);
  {
    WithChecks on(false, true);
    LNS_LAUNCH(neighbour_update_kernel, 1, 64, 0, nullptr)(out.p, in.p, true);
    const std::vector<float> got = out.get();
    for (int i = 0; i < 64; ++i) ASSERT_EQ(got[i], 2.0f * float((i + 1) % 64));
  }
  // Thread 1 overwrites buf[1] after thread 0 read it, with no barrier between.
  EXPECT_DEATH(
      {
        WithChecks on(false, true);
        LNS_LAUNCH(neighbour_update_kernel, 1, 64, 0, nullptr)(out.p, in.p, false);
        cudaDeviceSynchronize();
      },
      "kernel neighbour_update_kernel .* thread \\(1,0,0\\): shared-memory race: thread \\(1,0,0\\) wrote byte 4 "
      "of __shared__ buf that thread \\(0,0,0\\) read with no __syncthreads between them \\(the "
      "write at tests/gpu/test_sim_checks.cpp:[0-9]+.*, the read at tests/gpu/test_sim_checks.cpp:[0-9]+");
}

// The same race through dynamic shared memory, reported by its byte offset.
__global__ void dynamic_shift_kernel(float* out, const float* in) {
  LNS_EXTERN_SHARED(float, buf);
  buf[threadIdx.x] = in[threadIdx.x];
  out[threadIdx.x] = buf[(threadIdx.x + blockDim.x - 1) % blockDim.x];
}

TEST(SimChecks, DynamicSharedReadAfterWriteRaceIsReported) {
  LNS_NEEDS_READ_HOOKS();
  DevBuf in(32), out(32);
  in.set(std::vector<float>(32, 1.0f));
  EXPECT_DEATH(
      {
        WithChecks on(false, true);
        LNS_LAUNCH(dynamic_shift_kernel, 1, 32, 32 * sizeof(float), nullptr)(out.p, in.p);
        cudaDeviceSynchronize();
      },
      "thread \\(1,0,0\\) read dynamic shared byte 0 that thread \\(0,0,0\\) wrote");
}

// GCC drops the section attribute of a static inside a function template (PR 70435),
// so a template kernel's __shared__ variable is found by name instead
// (src/cuda/sim/static_shared.cpp). The same two checks hold for it: it starts each
// block as NaN bytes, and races on it are reported by the variable's name.
template <int kShift>
__global__ void template_shift_kernel(float* out, const float* in, bool sync) {
  __shared__ float tbuf[64];
  if (blockIdx.x == 0 || sync) tbuf[threadIdx.x] = in[threadIdx.x];  // block 1 skips the write
  if (sync) __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = tbuf[(threadIdx.x + kShift) % blockDim.x];
}

TEST(SimChecks, TemplateKernelSharedStartsUndefinedInEveryBlock) {
  DevBuf in(64), out(128);
  in.set(std::vector<float>(64, 1.0f));
  WithChecks off(false, false);
  LNS_LAUNCH(template_shift_kernel<0>, 2, 64, 0, nullptr)(out.p, in.p, false);
  const std::vector<float> got = out.get();
  EXPECT_EQ(got[5], 1.0f);            // block 0 wrote its own word before reading it
  EXPECT_TRUE(std::isnan(got[64 + 5])) << got[64 + 5];  // not block 0's value
}

TEST(SimChecks, TemplateKernelSharedRaceIsReportedByName) {
  LNS_NEEDS_READ_HOOKS();
  DevBuf in(64), out(128);
  in.set(std::vector<float>(64, 1.0f));
  {
    WithChecks on(false, true);
    LNS_LAUNCH(template_shift_kernel<63>, 2, 64, 0, nullptr)(out.p, in.p, true);
    EXPECT_EQ(out.get()[100], 1.0f);
  }
  EXPECT_DEATH(
      {
        WithChecks on(false, true);
        LNS_LAUNCH(template_shift_kernel<63>, 1, 64, 0, nullptr)(out.p, in.p, false);
        cudaDeviceSynchronize();
      },
      "thread \\(1,0,0\\) read byte 0 of __shared__ tbuf that thread \\(0,0,0\\) wrote with no __syncthreads");
}

// ---- barriers ------------------------------------------------------------------------

__global__ void divergent_barrier_kernel(float* out) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1.0f;
}
__global__ void early_return_kernel(float* out) {
  if (threadIdx.x >= 40) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

TEST(SimChecks, DivergentBarrierIsReported) {
  DevBuf out(64);
  EXPECT_DEATH(
      {
        LNS_LAUNCH(divergent_barrier_kernel, 1, 64, 0, nullptr)(out.p);
        cudaDeviceSynchronize();
      },
      "kernel divergent_barrier_kernel .* block \\(0,0,0\\) thread \\([0-9]+,0,0\\): divergent __syncthreads: .*"
      "test_sim_checks.cpp:[0-9]+");
}

TEST(SimChecks, BarrierAfterSomeThreadsReturnedIsReported) {
  DevBuf out(64);
  EXPECT_DEATH(
      {
        LNS_LAUNCH(early_return_kernel, 1, 64, 0, nullptr)(out.p);
        cudaDeviceSynchronize();
      },
      "__syncthreads at .*test_sim_checks.cpp:[0-9]+ is not reached by every thread: thread \\(40,0,0\\) has already "
      "returned");
}

// ---- warp shuffles -------------------------------------------------------------------

// out[i] = sum over the warp of in (the reduction of common.cuh), optionally with the
// shuffle in a branch that only half the warp takes.
__global__ void warp_sum_kernel(float* out, const float* in, bool diverge) {
  float v = in[threadIdx.x];
  if (!diverge || threadIdx.x % 32 < 16) v = warp_sum(v);
  out[threadIdx.x] = v;
}

// Reports name files relative to the checkout whatever its directory is called: one
// that ends in "src" once made them read src/src/cuda/common.cuh.
TEST(SimReports, SourcePathsAreRelativeToTheCheckout) {
  using sim::source_path;
  EXPECT_EQ(source_path("/tmp/x.src/src/cuda/common.cuh:69", "/tmp/x.src"), "src/cuda/common.cuh:69");
  EXPECT_EQ(source_path("/home/u/src/lns/tests/gpu/t.cpp", "/home/u/src/lns/"), "tests/gpu/t.cpp");
  EXPECT_EQ(source_path("/tmp/x.src/build/../src/cuda/norm.cu:41", "/tmp/x.src"), "src/cuda/norm.cu:41");
  EXPECT_EQ(source_path("build/../src/cuda/norm.cu:41", "/tmp/x.src"), "src/cuda/norm.cu:41");
  // compiled in build-sim/tests/gpu with ccache's base_dir set: relative to that folder
  EXPECT_EQ(source_path("../../../tests/gpu/t.cpp", "/tmp/x.src"), "tests/gpu/t.cpp");
  EXPECT_EQ(source_path("/usr/include/c++/12/bits/stl_algo.h:5", "/tmp/x.src"), "stl_algo.h:5");
  EXPECT_EQ(source_path("/tmp/x.srcfoo/src/a.cu", "/tmp/x.src"), "a.cu");  // a sibling, not the checkout
  // This build's own root: the path this file was compiled from.
  EXPECT_EQ(source_path(__FILE__), "tests/gpu/test_sim_checks.cpp");
}

TEST(SimChecks, ShuffleInADivergentBranchIsReported) {
  DevBuf in(64), out(64);
  std::vector<float> h(64);
  for (int i = 0; i < 64; ++i) h[i] = float(i);
  in.set(h);
  LNS_LAUNCH(warp_sum_kernel, 1, 64, 0, nullptr)(out.p, in.p, false);
  const std::vector<float> got = out.get();
  EXPECT_EQ(got[0], 31 * 32 / 2);                // 0 + ... + 31
  EXPECT_EQ(got[63], (32 + 63) * 32 / 2);        // 32 + ... + 63
  EXPECT_DEATH(
      {
        LNS_LAUNCH(warp_sum_kernel, 1, 64, 0, nullptr)(out.p, in.p, true);
        cudaDeviceSynchronize();
      },
      "kernel warp_sum_kernel .* block \\(0,0,0\\) thread \\(0,0,0\\): a warp shuffle at src/cuda/common.cuh:[0-9]+ "
      "with mask 0xffffffff: lane 16 is not converged \\(thread \\(16,0,0\\) has returned\\)");
}

TEST(SimChecks, FullMaskShuffleInAPartialWarpIsReported) {
  DevBuf in(48), out(48);
  in.set(std::vector<float>(48, 1.0f));
  EXPECT_DEATH(
      {
        LNS_LAUNCH(warp_sum_kernel, 1, 48, 0, nullptr)(out.p, in.p, false);
        cudaDeviceSynchronize();
      },
      "mask names lane 16 but the block has 48 threads");
}

// ---- launch configuration ------------------------------------------------------------

__global__ void fill_kernel(float* out, float v, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = v;
}

TEST(SimChecks, LaunchLimitsAreReported) {
  DevBuf out(4096);
  EXPECT_DEATH(LNS_LAUNCH(fill_kernel, 2, 2048, 0, nullptr)(out.p, 1.0f, 4096),
               "kernel fill_kernel \\(launched at .*test_sim_checks.cpp:[0-9]+\\): invalid launch configuration: "
               "block \\(2048,1,1\\) has 2048 threads; the limit is 1024");
  EXPECT_DEATH(LNS_LAUNCH(fill_kernel, dim3(1, 70000), 32, 0, nullptr)(out.p, 1.0f, 32),
               "grid \\(1,70000,1\\) exceeds");
  EXPECT_DEATH(LNS_LAUNCH(fill_kernel, 1, 32, 64 * 1024, nullptr)(out.p, 1.0f, 32),
               "65536 bytes of dynamic shared memory; above 48 KiB needs cudaFuncSetAttribute");
  // opted in: allowed up to the opt-in
  ASSERT_EQ(cudaFuncSetAttribute(fill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024), cudaSuccess);
  LNS_LAUNCH(fill_kernel, 1, 32, 64 * 1024, nullptr)(out.p, 1.0f, 32);
  EXPECT_NE(cudaFuncSetAttribute(fill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024), cudaSuccess);
  cudaDeviceSynchronize();
}

// ---- pointers ------------------------------------------------------------------------

TEST(SimChecks, HostPointerToAKernelIsReported) {
  std::vector<float> host(32);
  EXPECT_DEATH(LNS_LAUNCH(fill_kernel, 1, 32, 0, nullptr)(host.data(), 1.0f, 32),
               "kernel fill_kernel \\(launched at .*test_sim_checks.cpp:[0-9]+\\): pointer argument 0 \\(0x[0-9a-f]+\\) "
               "is not in a live device allocation");
  float* freed = nullptr;
  ASSERT_EQ(cudaMalloc(&freed, 128), cudaSuccess);
  ASSERT_EQ(cudaFree(freed), cudaSuccess);
  EXPECT_DEATH(LNS_LAUNCH(fill_kernel, 1, 32, 0, nullptr)(freed, 1.0f, 32), "not in a live device allocation");
}

TEST(SimChecks, CopiesOutsideAnAllocationAreReported) {
  DevBuf d(16);
  std::vector<float> h(32);
  EXPECT_DEATH(cudaMemcpy(d.p, h.data(), 32 * sizeof(float), cudaMemcpyHostToDevice),
               "cudaMemcpy destination: 0x[0-9a-f]+\\+128 is not inside one live device allocation");
  EXPECT_DEATH(cudaMemcpy(h.data(), h.data() + 16, 16, cudaMemcpyDeviceToHost),
               "cudaMemcpy source: .* is not inside one live device allocation");
}

// ---- out-of-bounds stores (AddressSanitizer) -----------------------------------------

// Stores 8 bf16 per thread, groups of 8: for n not a multiple of 8 the last group
// writes past the end unless the tail is handled (the off-by-one of a vector path).
__global__ void vec_store_kernel(bf16* out, int n, bool handle_tail) {
  const int i = (blockIdx.x * blockDim.x + threadIdx.x) * kVec;
  if (i >= n) return;
  float f[kVec] = {1, 1, 1, 1, 1, 1, 1, 1};
  if (handle_tail && i + kVec > n) {
    for (int k = 0; i + k < n; ++k) store<1>(out + i + k, f + k);
  } else {
    store<kVec>(out + i, f);
  }
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif

TEST(SimChecks, OffByOneVectorStoreIsReported) {
  if (!kAsan) GTEST_SKIP() << "needs the AddressSanitizer build (tests/run.sh builds build-sim with it)";
  bf16* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 20 * sizeof(bf16)), cudaSuccess);
  LNS_LAUNCH(vec_store_kernel, 1, 32, 0, nullptr)(out, 20, true);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_DEATH(
      {
        LNS_LAUNCH(vec_store_kernel, 1, 32, 0, nullptr)(out, 20, false);
        cudaDeviceSynchronize();
      },
      "heap-buffer-overflow");
  cudaFree(out);
}

TEST(SimChecks, OverrunInsideAScratchPoolIsReported) {
  if (!kAsan) GTEST_SKIP() << "needs the AddressSanitizer build (tests/run.sh builds build-sim with it)";
  // The scratch buffer grows to 4096 bytes first; a later user asks for 40 bytes of it
  // and overruns them: inside the allocation, but in the poisoned tail.
  scratch(Scratch::Cast, 4096);
  auto* out = static_cast<bf16*>(scratch(Scratch::Cast, 20 * sizeof(bf16)));
  LNS_LAUNCH(vec_store_kernel, 1, 32, 0, stream())(out, 20, true);
  synchronize();
  EXPECT_DEATH(
      {
        LNS_LAUNCH(vec_store_kernel, 1, 32, 0, stream())(out, 20, false);
        synchronize();
      },
      "use-after-poison");
}

TEST(SimChecks, WriteIntoFlatBufferPaddingIsReported) {
  // Two tensors of 10 floats at offsets 0 and 16 of one flat buffer (ParamSet's
  // layout), zero padding after each; a kernel that writes one element too many
  // stays inside the allocation (ASan is silent) but changes the padding.
  DevBuf flat(32);
  ASSERT_EQ(cudaMemset(flat.p, 0, 32 * sizeof(float)), cudaSuccess);
  pool_padding(flat.p + 10, 6 * sizeof(float), stream());
  pool_padding(flat.p + 26, 6 * sizeof(float), stream());
  LNS_LAUNCH(fill_kernel, 1, 32, 0, stream())(flat.p + 16, 1.0f, 10);
  synchronize();
  EXPECT_DEATH(
      {
        LNS_LAUNCH(fill_kernel, 1, 32, 0, stream())(flat.p, 1.0f, 11);
        synchronize();
      },
      "kernel fill_kernel \\(launched at .*test_sim_checks.cpp:[0-9]+\\): wrote into the zero padding between two "
      "tensors of a flat buffer: byte 2 of the 24 bytes of padding");
}

// ---- streams -------------------------------------------------------------------------

// A producer on the compute stream, a consumer on a side stream (as the NCCL
// communicator's): without the event wait the consumer may run first. The emulator
// runs it first (the latest enqueued work that may start), so the bug gives a wrong
// result every time instead of once in a while.
TEST(SimChecks, StreamReadWithoutEventWaitSeesStaleData) {
  WithChecks off(false, false, false);  // the race on purpose (the check below reports it)
  cudaStream_t side;
  ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t ready;
  ASSERT_EQ(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), cudaSuccess);
  for (bool wait : {true, false}) {
    DevBuf buf(256), copy(256);
    LNS_LAUNCH(fill_kernel, 1, 256, 0, stream())(buf.p, 0.0f, 256);
    synchronize();
    LNS_LAUNCH(fill_kernel, 1, 256, 0, stream())(buf.p, 7.0f, 256);
    if (wait) {
      ASSERT_EQ(cudaEventRecord(ready, stream()), cudaSuccess);
      ASSERT_EQ(cudaStreamWaitEvent(side, ready, 0), cudaSuccess);
    }
    ASSERT_EQ(cudaMemcpyAsync(copy.p, buf.p, 256 * sizeof(float), cudaMemcpyDeviceToDevice, side), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(side), cudaSuccess);
    std::vector<float> h(256);
    ASSERT_EQ(cudaMemcpyAsync(h.data(), copy.p, 256 * sizeof(float), cudaMemcpyDeviceToHost, side), cudaSuccess);
    EXPECT_EQ(h[17], wait ? 7.0f : 0.0f) << (wait ? "with" : "without") << " the event wait";
    synchronize();
  }
  cudaEventDestroy(ready);
  cudaStreamDestroy(side);
}

TEST(SimChecks, LegacyDefaultStreamOrdersBlockingStreams) {
  // cudaMemset on the legacy stream, then a kernel on a blocking stream: the kernel
  // waits for the memset (and a kernel on the legacy stream for both).
  DevBuf buf(64);
  ASSERT_EQ(cudaMemset(buf.p, 0, 64 * sizeof(float)), cudaSuccess);
  LNS_LAUNCH(fill_kernel, 1, 32, 0, stream())(buf.p, 3.0f, 32);
  LNS_LAUNCH(fill_kernel, 1, 16, 0, nullptr)(buf.p, 5.0f, 16);
  const std::vector<float> h = buf.get();
  EXPECT_EQ(h[0], 5.0f);
  EXPECT_EQ(h[20], 3.0f);
  EXPECT_EQ(h[40], 0.0f);
}

// ---- cross-stream races (LNS_SIM_CHECKS=streams, happens_before.cpp) -------------------

// out[i] = in[i]                                                                     [n]
__global__ void copy_kernel(float* out, const float* in, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}

// Two non-blocking streams (as the NCCL communicator's side stream is) and an event.
struct TwoStreams {
  cudaStream_t a = nullptr, b = nullptr;
  cudaEvent_t done = nullptr;
  TwoStreams() {
    LNS_CUDA_CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    LNS_CUDA_CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    LNS_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  }
  // b waits for what a has queued so far
  void b_after_a() {
    LNS_CUDA_CHECK(cudaEventRecord(done, a));
    LNS_CUDA_CHECK(cudaStreamWaitEvent(b, done, 0));
  }
  ~TwoStreams() {
    cudaDeviceSynchronize();
    cudaEventDestroy(done), cudaStreamDestroy(a), cudaStreamDestroy(b);
  }
};

// The kernel accesses are seen through the access hooks.
#define LNS_NEEDS_ACCESS_HOOKS()                                                                  \
  if (!sim::race_sees_reads())                                                                    \
  GTEST_SKIP() << "this build has no access hooks (an ASan build: GCC's -fsanitize=thread, which " \
                  "provides them, excludes -fsanitize=address); the Release emulation build runs it"

// What every report says after naming the two ops.
#define LNS_UNORDERED "and nothing orders the two: no event recorded on stream [0-9]+ \\(non-blocking\\) after the first"

TEST(SimStreams, KernelReadingAnotherStreamsWriteWithoutAnEventIsReported) {
  LNS_NEEDS_ACCESS_HOOKS();
  DevBuf in(256), out(256);
  in.set(std::vector<float>(256, 0.0f));
  {  // ordered by the event: runs and reads the new values
    WithChecks on(false, false, true);
    TwoStreams s;
    LNS_LAUNCH(fill_kernel, 1, 256, 0, s.a)(in.p, 3.0f, 256);
    s.b_after_a();
    LNS_LAUNCH(copy_kernel, 1, 256, 0, s.b)(out.p, in.p, 256);
    LNS_CUDA_CHECK(cudaStreamSynchronize(s.b));
    EXPECT_EQ(out.get()[100], 3.0f);
  }
  EXPECT_DEATH(
      {
        WithChecks on(false, false, true);
        TwoStreams s;
        LNS_LAUNCH(fill_kernel, 1, 256, 0, s.a)(in.p, 3.0f, 256);
        LNS_LAUNCH(copy_kernel, 1, 256, 0, s.b)(out.p, in.p, 256);
        cudaDeviceSynchronize();
      },
      "cross-stream race on bytes \\[[0-9]+, [0-9]+\\) of the 1024-byte device allocation at 0x[0-9a-f]+: "
      "kernel fill_kernel \\(launched at tests/gpu/test_sim_checks.cpp:[0-9]+\\) on stream [0-9]+ \\(non-blocking\\) "
      "wrote them, then kernel copy_kernel \\(launched at tests/gpu/test_sim_checks.cpp:[0-9]+\\) on stream [0-9]+ "
      "\\(non-blocking\\) read them, " LNS_UNORDERED);
}

TEST(SimStreams, OverwritingWhatAnotherStreamStillReadsIsReported) {
  // The next micro-batch's kernel on one stream overwrites the buffer that a reader on
  // another stream (a collective's, here a kernel) has not been waited for.
  LNS_NEEDS_ACCESS_HOOKS();
  DevBuf in(64), out(64);
  in.set(std::vector<float>(64, 1.0f));
  EXPECT_DEATH(
      {
        WithChecks on(false, false, true);
        TwoStreams s;
        LNS_LAUNCH(copy_kernel, 1, 64, 0, s.b)(out.p, in.p, 64);
        LNS_LAUNCH(fill_kernel, 1, 64, 0, s.a)(in.p, 2.0f, 64);
        cudaDeviceSynchronize();
      },
      "kernel copy_kernel .* read them, then kernel fill_kernel .* wrote them, " LNS_UNORDERED);
}

TEST(SimStreams, HostCopyWithoutSynchronisingWithTheWriterIsReported) {
  // cudaMemcpy to the host runs on the legacy default stream, which does not wait for
  // non-blocking streams: the copy may read the buffer before the kernel wrote it.
  LNS_NEEDS_ACCESS_HOOKS();
  DevBuf buf(32);
  std::vector<float> h(32);
  {  // after a synchronisation with the writer's stream: fine
    WithChecks on(false, false, true);
    TwoStreams s;
    LNS_LAUNCH(fill_kernel, 1, 32, 0, s.a)(buf.p, 4.0f, 32);
    LNS_CUDA_CHECK(cudaStreamSynchronize(s.a));
    LNS_CUDA_CHECK(cudaMemcpy(h.data(), buf.p, sizeof(float) * 32, cudaMemcpyDeviceToHost));
    EXPECT_EQ(h[31], 4.0f);
  }
  EXPECT_DEATH(
      {
        WithChecks on(false, false, true);
        TwoStreams s;
        LNS_LAUNCH(fill_kernel, 1, 32, 0, s.a)(buf.p, 4.0f, 32);
        cudaMemcpy(h.data(), buf.p, sizeof(float) * 32, cudaMemcpyDeviceToHost);
      },
      "kernel fill_kernel .* on stream [0-9]+ \\(non-blocking\\) wrote them, then cudaMemcpy \\(called from .*\\) "
      "on the legacy default stream read them, and nothing orders the two");
}

TEST(SimStreams, WorkTheEmulatorRanEarlyDoesNotHideAMissingWait) {
  // The reader is queued before anything orders it after the writer; a later sync with
  // the writer's stream makes the emulator run the writer first, so the reader sees the
  // new values (no wrong result to notice). The program still declared no order.
  LNS_NEEDS_ACCESS_HOOKS();
  DevBuf in(64), out(64);
  in.set(std::vector<float>(64, 0.0f));
  EXPECT_DEATH(
      {
        WithChecks on(false, false, true);
        TwoStreams s;
        LNS_LAUNCH(fill_kernel, 1, 64, 0, s.a)(in.p, 5.0f, 64);
        LNS_LAUNCH(copy_kernel, 1, 64, 0, s.b)(out.p, in.p, 64);
        cudaStreamSynchronize(s.a);  // runs the writer now
        cudaStreamSynchronize(s.b);
        std::fprintf(stderr, "read %g without a report\n", double(out.get()[0]));
      },
      "kernel fill_kernel .* wrote them, then kernel copy_kernel .* read them, " LNS_UNORDERED
      ".*the emulator ran the first one first");
}

TEST(SimStreams, HostSynchronisationAndBlockingStreamsOrderWork) {
  // No report where the program did order the two: a host sync between them, the
  // legacy default stream's implicit waits for a blocking stream, an event re-recorded.
  LNS_NEEDS_ACCESS_HOOKS();
  WithChecks on(false, false, true);
  DevBuf buf(64), out(64);
  TwoStreams s;
  LNS_LAUNCH(fill_kernel, 1, 64, 0, s.a)(buf.p, 1.0f, 64);
  LNS_CUDA_CHECK(cudaStreamSynchronize(s.a));
  LNS_LAUNCH(copy_kernel, 1, 64, 0, s.b)(out.p, buf.p, 64);  // after the host sync
  LNS_CUDA_CHECK(cudaDeviceSynchronize());
  LNS_LAUNCH(fill_kernel, 1, 64, 0, stream())(buf.p, 2.0f, 64);  // the blocking compute stream
  LNS_CUDA_CHECK(cudaMemcpy(out.p, buf.p, 64 * sizeof(float), cudaMemcpyDeviceToDevice));  // legacy: waits for it
  LNS_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // and the host waits for the copy
  LNS_LAUNCH(fill_kernel, 1, 64, 0, s.a)(buf.p, 3.0f, 64);
  s.b_after_a();
  LNS_LAUNCH(fill_kernel, 1, 64, 0, s.a)(out.p, 9.0f, 64);  // after the record: not waited for, other buffer
  LNS_LAUNCH(copy_kernel, 1, 64, 0, s.b)(out.p + 0, buf.p, 0);  // reads nothing
  LNS_LAUNCH(copy_kernel, 1, 64, 0, s.b)(buf.p, buf.p, 64);   // reads and writes after the wait
  LNS_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(buf.get()[7], 3.0f);
}

// ---- CUDA graphs (stream capture and replay) --------------------------------------------

// fill then copy, captured on `s` into an instantiated graph
cudaGraphExec_t capture_fill_copy(cudaStream_t s, float* buf, float* out, float v, int n) {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  LNS_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  LNS_LAUNCH(fill_kernel, 1, n, 0, s)(buf, v, n);
  LNS_LAUNCH(copy_kernel, 1, n, 0, s)(out, buf, n);
  LNS_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  LNS_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
  LNS_CUDA_CHECK(cudaGraphDestroy(g));
  return exec;
}

TEST(SimGraphs, CaptureRecordsWithoutRunningAndEachLaunchReplays) {
  DevBuf buf(64), out(64);
  buf.set(std::vector<float>(64, 0.0f));
  out.set(std::vector<float>(64, 0.0f));
  TwoStreams s;
  const sim::Counters before = sim::counters();
  cudaGraphExec_t exec = capture_fill_copy(s.a, buf.p, out.p, 6.0f, 64);
  cudaStreamCaptureStatus status;
  LNS_CUDA_CHECK(cudaStreamIsCapturing(s.a, &status));
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  LNS_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(out.get()[9], 0.0f) << "capture ran the work";
  EXPECT_EQ(sim::counters().launches - before.launches, 2u) << "the captured launches";
  EXPECT_EQ(sim::counters().kernels_run, before.kernels_run);
  for (int i = 0; i < 2; ++i) LNS_CUDA_CHECK(cudaGraphLaunch(exec, s.a));
  LNS_CUDA_CHECK(cudaStreamSynchronize(s.a));
  EXPECT_EQ(out.get()[9], 6.0f);
  EXPECT_EQ(sim::counters().launches - before.launches, 2u) << "a replay launches nothing more";
  EXPECT_EQ(sim::counters().graph_launches - before.graph_launches, 2u);
  EXPECT_EQ(sim::counters().kernels_run - before.kernels_run, 4u);
  LNS_CUDA_CHECK(cudaGraphExecDestroy(exec));
}

TEST(SimGraphs, WhatAGpuRefusesDuringACaptureIsReported) {
  DevBuf buf(64);
  std::vector<float> h(64);
  const auto capturing = [&](auto&& call) {
    TwoStreams s;
    LNS_CUDA_CHECK(cudaStreamBeginCapture(s.a, cudaStreamCaptureModeThreadLocal));
    LNS_LAUNCH(fill_kernel, 1, 64, 0, s.a)(buf.p, 1.0f, 64);
    call(s.a);
  };
  EXPECT_DEATH(capturing([](cudaStream_t a) { cudaStreamSynchronize(a); }),
               "cudaStreamSynchronize while stream [0-9]+ \\(non-blocking\\) captures a CUDA graph: not permitted");
  EXPECT_DEATH(capturing([&](cudaStream_t a) {
                 cudaMemcpyAsync(h.data(), buf.p, 256, cudaMemcpyDeviceToHost, a);
               }),
               "cudaMemcpyAsync between host and device memory while stream [0-9]+ \\(non-blocking\\) captures a "
               "CUDA graph: a pageable host copy cannot be captured");
  EXPECT_DEATH(capturing([](cudaStream_t) {
                 void* p = nullptr;
                 cudaMalloc(&p, 64);
               }),
               "cudaMalloc while stream [0-9]+ \\(non-blocking\\) captures a CUDA graph");
  EXPECT_DEATH(capturing([](cudaStream_t a) {
                 cudaEvent_t e;
                 cudaEventCreate(&e);
                 cudaEventRecord(e, a);
               }),
               "cudaEventRecord on stream [0-9]+ \\(non-blocking\\) while it captures a CUDA graph: events inside a "
               "capture .* are not emulated");
}

TEST(SimStreams, AGraphReplayReadByAnotherStreamWithoutAWaitIsReported) {
  LNS_NEEDS_ACCESS_HOOKS();
  DevBuf buf(64), out(64), other(64);
  buf.set(std::vector<float>(64, 0.0f));
  EXPECT_DEATH(
      {
        WithChecks on(false, false, true);
        TwoStreams s;
        cudaGraphExec_t exec = capture_fill_copy(s.a, buf.p, out.p, 2.0f, 64);
        cudaGraphLaunch(exec, s.a);
        LNS_LAUNCH(copy_kernel, 1, 64, 0, s.b)(other.p, buf.p, 64);
        cudaDeviceSynchronize();
      },
      "kernel fill_kernel \\(launched at tests/gpu/test_sim_checks.cpp:[0-9]+, replayed by cudaGraphLaunch\\) on "
      "stream [0-9]+ \\(non-blocking\\) wrote them, then kernel copy_kernel .* read them, " LNS_UNORDERED);
}

TEST(SimChecks, WorkRunsAtSyncPointsAndCudaFreeSynchronises) {
  // Device memory is host memory here, so the test can look without a copy: queued
  // work has not run until something synchronises; cudaFree does (CUDA documents it).
  DevBuf a(32);
  LNS_LAUNCH(fill_kernel, 1, 32, 0, stream())(a.p, 2.0f, 32);
  EXPECT_TRUE(std::isnan(a.p[5])) << "ran before any synchronisation";
  float* other = nullptr;
  ASSERT_EQ(cudaMalloc(&other, 64), cudaSuccess);
  ASSERT_EQ(cudaFree(other), cudaSuccess);
  EXPECT_EQ(a.p[5], 2.0f);
}

// ---- counters and properties ---------------------------------------------------------

TEST(SimChecks, LaunchesAndHostSyncsAreCounted) {
  DevBuf a(32);
  synchronize();
  const sim::Counters before = sim::counters();
  for (int i = 0; i < 3; ++i) LNS_LAUNCH(fill_kernel, 1, 32, 0, stream())(a.p, float(i), 32);
  EXPECT_EQ(sim::counters().launches - before.launches, 3u);
  EXPECT_EQ(sim::counters().host_syncs, before.host_syncs) << "launches do not wait";
  synchronize();
  EXPECT_EQ(sim::counters().host_syncs - before.host_syncs, 1u);
  const size_t peak = sim::device_memory_peak(0);
  { DevBuf big(1 << 22); }
  EXPECT_GE(sim::device_memory_peak(0), std::max(peak, sim::device_memory_in_use(0) + (16u << 20)));
}

// Steady state of a CUDA training step (docs/cuda.md, "Host synchronisations"): no
// host synchronisation per micro-batch. The same global batch in 1 and in 4
// micro-batches must wait for the device the same number of times per step (the
// loss read once, the gradient norm, the step's uploads), while launching ~4x the
// kernels. The embedding backward read the ids back before (one wait per micro-batch).
TEST(SimCounts, AStepWaitsForTheDeviceTheSameTimesWhateverItsMicroBatches) {
  LlamaConfig c;
  c.vocab_size = 61, c.hidden_size = 32, c.intermediate_size = 45, c.num_layers = 2;
  c.num_heads = 4, c.num_kv_heads = 2, c.norm_scheme = NormScheme::LNS;
  WithChecks off(false, false);  // counts, not checks: keeps the test fast
  (void)cudaGetLastError();      // run with the others in one process: an earlier test's deliberate error
  uint64_t syncs[2], launches[2];
  for (int k = 0; k < 2; ++k) {
    TrainConfig tc;
    tc.device = Device::CUDA;
    tc.seq_len = 16, tc.global_batch = 4, tc.micro_batch = k == 0 ? 4 : 1, tc.steps = 3;
    Trainer tr(c, tc);
    tr.train_step();  // the first step grows the scratch buffers (a regrowth waits)
    synchronize();
    const sim::Counters before = sim::counters();
    tr.train_step();
    synchronize();  // the step's queued work, so that every launch is counted
    syncs[k] = sim::counters().host_syncs - before.host_syncs - 1;  // less the synchronize() above
    launches[k] = sim::counters().launches - before.launches;
  }
  std::printf("[ counts ] per step: 1 micro-batch %llu launches, %llu host syncs; 4 micro-batches %llu launches, "
              "%llu host syncs\n",
              (unsigned long long)launches[0], (unsigned long long)syncs[0], (unsigned long long)launches[1],
              (unsigned long long)syncs[1]);
  EXPECT_EQ(syncs[1], syncs[0]) << "a micro-batch synchronises with the host";
  EXPECT_GT(launches[1], 3 * launches[0]) << "the 4 micro-batches did not run";
}

// --cuda_graphs (PipelineSchedule1F1B::graphs_apply): the graphed step runs the same
// kernels as the ungraphed one, from one launch per step for all micro-batches but the
// last, and computes the same bits (losses and weights after three steps; the first
// step runs ungraphed, the second records, the third records again: grad_scale and
// pointers are read at record time).
// LNS, and every block routed (each micro-batch's Gumbel noise uploaded before its launch).
class SimGraphsScheme : public ::testing::TestWithParam<NormScheme> {};
TEST_P(SimGraphsScheme, GraphedStepsEqualUngraphedBitForBit) {
#if defined(__SANITIZE_ADDRESS__)
  // Under ASan (3 minutes for routed blocks at 8 micro-batches): LNS at 4. The Release
  // emulation build runs both at 8.
  if (GetParam() != NormScheme::LNS) GTEST_SKIP() << "routed blocks: the Release emulation build runs them";
  constexpr int kMicro = 4;
#else
  constexpr int kMicro = 8;
#endif
  // The kernels' own checks run in their tests; the cross-stream check stays as the
  // environment sets it (it sees every replay).
  WithChecks kernels_off(false, false, sim::options().stream_check);
  (void)cudaGetLastError();  // run with the others in one process: an earlier test's deliberate error
  test::GraphedSteps runs[2];
  uint64_t launches[2], kernels[2], graphs[2];
  for (int graphed = 0; graphed < 2; ++graphed) {
    sim::Counters before;
    runs[graphed] = test::run_graphed_steps(GetParam(), kMicro, graphed, [&](int, bool after) {
      if (!after) {
        before = sim::counters();
        return;
      }
      launches[graphed] = sim::counters().launches - before.launches;
      kernels[graphed] = sim::counters().kernels_run - before.kernels_run;
      graphs[graphed] = sim::counters().graph_launches - before.graph_launches;
    });
  }
  std::printf("[ graphs ] %s, per step: ungraphed %llu launches; graphed %llu launches + %llu graph launches; %llu "
              "kernels run in both\n",
              norm_scheme_name(GetParam()), (unsigned long long)launches[0], (unsigned long long)launches[1],
              (unsigned long long)graphs[1], (unsigned long long)kernels[1]);
  EXPECT_EQ(graphs[0], 0u);
  EXPECT_EQ(graphs[1], uint64_t(kMicro - 1)) << "micro-batches 0..M-2";
  EXPECT_EQ(kernels[1], kernels[0]) << "the graphed step runs other kernels";
  // Launched: the graph's kernels once, at record time, and the last micro-batch's,
  // about 2 of the M micro-batches' launches (plus the optimizer's): under 3/M.
  EXPECT_LT(launches[1] * kMicro, launches[0] * 3) << "the graph did not replace the launches";
  for (int step = 0; step < 3; ++step) EXPECT_EQ(runs[1].losses[step], runs[0].losses[step]) << "step " << step + 1;
  ASSERT_EQ(runs[0].weights.size(), runs[1].weights.size());
  EXPECT_EQ(0, std::memcmp(runs[0].weights.data(), runs[1].weights.data(), runs[0].weights.size() * 4));
}
INSTANTIATE_TEST_SUITE_P(Schemes, SimGraphsScheme, ::testing::Values(NormScheme::LNS, NormScheme::Routed),
                         [](const auto& info) { return std::string(norm_scheme_name(info.param)); });

TEST(SimChecks, DevicePropertiesAreAnH100) {
  cudaDeviceProp p;
  ASSERT_EQ(cudaGetDeviceProperties(&p, 0), cudaSuccess);
  EXPECT_EQ(p.multiProcessorCount, 132);
  EXPECT_EQ(p.major, 9);
  EXPECT_EQ(p.totalGlobalMem, size_t{80} << 30);
  size_t free_b = 0, total_b = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  const size_t before = total_b - free_b;
  {
    DevBuf b(1 << 20);
    ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
    EXPECT_EQ(total_b - free_b, before + (4u << 20));
  }
  ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  EXPECT_EQ(total_b - free_b, before);
}


// ---- the cuDNN attention stand-in (src/cuda/sim/cudnn_sdpa.cpp) ------------------------
// It refuses what the library refuses, naming the call and the tensor; the accepted
// problem next to each refusal runs.
TEST(SimCudnn, RefusesWhatTheLibraryRefuses) {
  DevBuf q(1 << 14), k(1 << 14), v(1 << 14), o(1 << 14), stats(1 << 10);  // 64 KiB each, 4 KiB stats
  const auto* qb = reinterpret_cast<const uint16_t*>(q.p);
  const auto run = [&](SdpaProblem p, const uint16_t* qp, uint16_t* op) {
    sdpa_forward(p, SdpaForward{op, stats.p, qp, reinterpret_cast<const uint16_t*>(k.p),
                                reinterpret_cast<const uint16_t*>(v.p)},
                 nullptr);
    LNS_CUDA_CHECK(cudaDeviceSynchronize());
  };
  auto* ob = reinterpret_cast<uint16_t*>(o.p);
  const SdpaProblem ok{1, 8, 4, 2, 64, 0.125f};
  run(ok, qb, ob);
  EXPECT_DEATH(run(ok, qb + 1, ob), "cuDNN sdpa forward: Q is not 16-byte aligned");
  SdpaProblem wide = ok;
  wide.D = 136;
  EXPECT_DEATH(run(wide, qb, ob), "cuDNN sdpa forward: head dim 136 is not supported for bf16");
  SdpaProblem groups = ok;
  groups.Hq = 3;
  EXPECT_DEATH(run(groups, qb, ob), "cuDNN sdpa forward: Hq=3 is not a multiple of Hkv=2");
  EXPECT_DEATH(run(ok, qb, const_cast<uint16_t*>(qb)), "cuDNN sdpa forward: O overlaps Q");
  SdpaProblem longer = ok;
  longer.T = 4096;  // 4 MiB of Q in a 64 KiB buffer
  EXPECT_DEATH(run(longer, qb, ob), "cuDNN sdpa forward: Q: .* is not inside one live device allocation");
}

}  // namespace
}  // namespace lns::cuda
