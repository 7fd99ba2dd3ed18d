// What the stand-in tests (tests/sim) need from "the device": allocation, copies,
// synchronisation and the current device. Two implementations: sim_api_stub.cpp (the
// CPU build: a malloc registry and a queue run at synchronize(), no SIMT runtime) and
// device_mem_cuda.cpp (the emulation build: the CUDA runtime calls, i.e. the real
// emulator), so the same tests check the stand-ins against both.
#pragma once
#include <cstddef>

namespace lns::simtest {

void* device_alloc(size_t bytes);
void device_free(void* p);
void upload(void* dst, const void* src, size_t bytes);    // host -> device
void download(void* dst, const void* src, size_t bytes);  // device -> host
void synchronize();                                       // everything queued has run
void set_device(int device);
// True when queued work provably has not run before synchronize() (the stub).
bool deferred_until_sync();

}  // namespace lns::simtest
