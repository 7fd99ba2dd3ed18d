// What the emulator counts (-DLNS_CUDA_SIM=ON): real numbers of the program's CUDA use,
// printed by lns_bench_step --device=cuda. No times: the emulator's are not a GPU's.
#pragma once
#include <cstddef>
#include <cstdint>

namespace lns::sim {

struct Counters {
  uint64_t launches = 0;    // kernel launches (a graph's kernels count once, when captured)
  uint64_t graph_launches = 0;  // cudaGraphLaunch calls
  uint64_t kernels_run = 0;     // grids executed: launched ones and graph replays' kernels
  uint64_t host_syncs = 0;  // host waits for the device: stream/event/device syncs,
                            // copies to host memory, cudaFree
};
Counters& counters();

// Bytes of device memory allocated on `device` now, and at most since the start or
// the last reset_device_memory_peak().
size_t device_memory_in_use(int device);
size_t device_memory_peak(int device);
void reset_device_memory_peak();

}  // namespace lns::sim
