// Sub-allocated device memory: the bytes of an allocation that its current user must
// not touch (the tail of a scratch buffer beyond what was asked for, the alignment
// gaps between attention's carved sub-buffers). Under the SIMT emulator they are
// poisoned in stream order (AddressSanitizer manual poisoning; without ASan filled
// with NaN bytes), so an overrun inside a pool is reported like one past the end of
// an allocation. In the real CUDA build these are no-ops.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace lns::cuda {

// pool_padding: zero bytes between the tensors of a flat buffer that whole-buffer ops
// (AdamW, the gradient norm, all-reduces) read and write but that must stay zero:
// under the emulator every kernel is checked not to have changed them.
#ifdef LNS_CUDA_SIM
void pool_gap(const void* p, size_t bytes, cudaStream_t stream);  // src/cuda/sim/runtime.cpp
void pool_use(const void* p, size_t bytes, cudaStream_t stream);
void pool_padding(const void* p, size_t bytes, cudaStream_t stream);
#else
inline void pool_gap(const void*, size_t, cudaStream_t) {}
inline void pool_use(const void*, size_t, cudaStream_t) {}
inline void pool_padding(const void*, size_t, cudaStream_t) {}
#endif

}  // namespace lns::cuda
