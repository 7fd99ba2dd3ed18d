// The emulator's internal interface (-DLNS_CUDA_SIM=ON): what the cuBLASLt, NCCL and
// mma.sync stand-ins need from the SIMT runtime. The runtime (src/cuda/sim/runtime*)
// implements it; the stand-ins use nothing else of it, so each can be written and
// tested on its own. Not used by the real CUDA build.
#pragma once
#include <cstddef>
#include <functional>
#include <string>

struct CUstream_st;
typedef CUstream_st* cudaStream_t;  // the same spelling as the real runtime

namespace lns::sim {

// Reports an error that the real library or GPU would have failed on (or silently
// mis-computed) and stops the process: one line naming the operation and, inside a
// kernel, the kernel, block, thread and source line. Death tests assert on it.
[[noreturn]] void fail(const std::string& message);

// [p, p + bytes) must lie inside one live device allocation; otherwise
// fail("<what>: <p>+<bytes> is not inside one live device allocation").
void require_device_range(const void* p, std::size_t bytes, const char* what);

// Queues `op` on `stream` (nullptr: the legacy default stream). It runs at a later
// synchronisation point, in the emulator's adversarial but legal order (stream order
// and event waits respected, nothing else), on the device current at enqueue time.
// `caller`: the code that called the API (its return address), for reports.
void enqueue(cudaStream_t stream, const char* name, std::function<void()> op, const void* caller = nullptr);

// Called by a queued op while it runs: it reads (or writes) device bytes [p, p + bytes).
// The cross-stream race check (LNS_SIM_CHECKS=streams) sees kernels' accesses through
// their access hooks; copies and the stand-ins declare theirs with this.
void declare_access(const void* p, std::size_t bytes, bool write);

// The device this host thread has bound with cudaSetDevice (several emulated devices
// may live in one process).
int current_device();

// For warp-collective instructions (mma.sync, ldmatrix): every lane of the calling
// warp named in `mask` calls this with a pointer to its own lane data; when all have
// arrived, `body` runs once with the 32 pointers (lanes outside `mask`: nullptr),
// then every lane continues. A lane that is not converged with the others (a divergent
// call, a lane that exited) is reported through fail(), naming `what`.
void warp_collective(unsigned mask, void* lane_data,
                     void (*body)(void* const lanes[32], void* ctx), void* ctx,
                     const char* what);

}  // namespace lns::sim
