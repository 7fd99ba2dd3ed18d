// The CUDA runtime state of a process: one compute stream that every kernel, GEMM and
// host<->device copy of the backend is queued on (so their order is program order),
// grow-only scratch buffers for kernels that need temporary memory, and error checks.
// Host code only; kernels see plain pointers.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace lns::cuda {

// Fatal (programmer or driver error) with the CUDA error string and the call site.
void check(cudaError_t e, const char* what, const char* file, int line);
#define LNS_CUDA_CHECK(expr) ::lns::cuda::check((expr), #expr, __FILE__, __LINE__)
// After a kernel launch: catches bad launch configurations at once.
#define LNS_CUDA_LAUNCHED() LNS_CUDA_CHECK(cudaGetLastError())

cudaStream_t stream();
// Waits for the compute stream. While it waits, every registered watch runs about
// every 100 us, so that work which can never finish (NCCL: a failed peer) ends the
// process with a message instead of a hang; a watch that finds an error throws.
void synchronize();
void add_sync_watch(void (*watch)(void* ctx), void* ctx);
void remove_sync_watch(void* ctx);

// Temporary device memory, one buffer per user so that two ops in flight never share
// one. Grows (reallocates, synchronizing) only when a larger size is asked for, so
// after the first step nothing is allocated.
enum class Scratch { NormPartials, Embedding, Attention, Reduce, Cast, Fp8Operands, Fp8Partials, kCount };
void* scratch(Scratch which, size_t bytes);

// Multiprocessors of the current device (cached).
int sm_count();

}  // namespace lns::cuda
