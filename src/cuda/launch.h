// How the CUDA sources launch kernels and declare dynamic shared memory, so that the
// same text compiles under nvcc (the chevrons and `extern __shared__`) and as plain
// C++ for the SIMT emulator (-DLNS_CUDA_SIM=ON, src/cuda/sim/, docs/cuda.md), where a
// launch is a call into the emulator that checks the configuration and the pointer
// arguments and queues the grid on the stream.
//
//   LNS_LAUNCH(kernel, grid, block, shared_bytes, stream)(args...);
//   LNS_EXTERN_SHARED(float, acc);   // extern __shared__ float acc[];
//
// A kernel name with a comma (two template arguments) goes in parentheses or through
// a function pointer, as with the chevrons.
#pragma once

#ifdef LNS_CUDA_SIM
#include "cuda/sim/launch_sim.h"
#define LNS_LAUNCH(kernel, grid, block, shared_bytes, stream) \
  ::lns::sim::Launch(#kernel, kernel, grid, block, shared_bytes, stream, __FILE__, __LINE__)
#define LNS_EXTERN_SHARED(type, name) type* const name = static_cast<type*>(::lns::sim::dynamic_shared())
#else
#define LNS_LAUNCH(kernel, grid, block, shared_bytes, stream) kernel<<<grid, block, shared_bytes, stream>>>
#define LNS_EXTERN_SHARED(type, name) extern __shared__ type name[]
#endif
