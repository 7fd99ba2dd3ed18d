// What the emulator's runtime (runtime.cpp: devices, memory, streams) and its SIMT
// engine (block.cpp: fibers, barriers, warp operations) tell each other. Not for the
// stand-ins: they use sim_api.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda/sim/launch_sim.h"
#include "cuda/sim/sim_api.h"

namespace lns::sim {

// A stretch of shared memory: one static __shared__ variable, the launch's dynamic
// bytes, or the whole static section (a binary without symbols).
struct SharedVar {
  char* p = nullptr;
  size_t bytes = 0;
  std::string name;  // for reports: the variable's name, "dynamic", or "" (the section)
};
// The static __shared__ variables kernel `func` can reach (static_shared.cpp), found
// in the symbol table; fixed once worked out, so a queued grid keeps its own.
std::shared_ptr<const std::vector<SharedVar>> kernel_static_shared(const void* func);

// One queued kernel launch.
struct Grid {
  LaunchSite site;
  dim3 grid, block;
  size_t shared_bytes = 0;
  std::function<void()> body;          // one CUDA thread
  std::vector<const void*> pointers;   // its pointer arguments (for the two-order check)
  std::shared_ptr<const std::vector<SharedVar>> static_shared;  // kernel_static_shared(kernel)
};

// Which checks run (environment LNS_SIM_CHECKS, a comma list; tests set them directly):
//   reverse: every grid runs twice, threads and blocks in opposite orders, and the
//            device memory it can reach must come out bitwise equal;
//   race:    shared-memory race detection (race.cpp, docs/cuda.md);
//   streams: the cross-stream race check over device memory (happens_before.cpp).
struct Options {
  bool reverse_check = false;
  bool race_check = false;
  bool stream_check = false;
};
Options& options();

// Executes every block of `g` on the calling OS thread, one block at a time, threads
// in increasing (or, reversed, decreasing) linear order between synchronisations.
void run_grid(const Grid& g, bool reversed);

// The shared-memory race check (race.cpp), driven by the engine while a block runs
// with options().race_check: the block's shared memory (every stretch of it), the
// fiber about to run, the end of its slice (where it waits: for the
// report of the snapshot mode), each completed __syncthreads.
void race_begin_block(const std::vector<SharedVar>& shared);
void race_resume(int linear_thread);
void race_after_slice(const char* waited_file, int waited_line);
void race_barrier();
void race_end_block();

// A source path as every report prints it: relative to the checkout the emulator was
// built from (`root`; by default the build's LNS_SOURCE_ROOT), so that
// /home/u/lns.src/src/cuda/norm.cu:41 reads src/cuda/norm.cu:41 wherever the checkout
// sits and whatever its name. A relative path (a line table's build/../src/x.cu) is
// normalised, and one that climbs out of the folder it was compiled in (ccache's
// base_dir writes ../../../tests/gpu/x.cpp) loses the climb; a path outside the
// checkout (a system header) keeps its last component.
std::string source_path(const std::string& file, std::string root = "");
// Whether the kernels were built with the access hooks, so that reads are seen too.
bool race_sees_reads();

// The sentence fail() prefixes inside a kernel: "kernel K (launched at F:L) block
// (x,y,z) thread (x,y,z)"; empty outside kernels.
std::string kernel_context();

// The live device allocation holding [p, p + bytes), or false.
struct Allocation {
  char* base = nullptr;
  size_t bytes = 0;
  int device = 0;
};
bool find_allocation(const void* p, size_t bytes, Allocation* out);
// The allocation holding address p (true), or the stretch [*gap_lo, *gap_hi) between
// allocations that holds it (false). The answer stays valid while
// allocation_generation() (bumped by every cudaMalloc and cudaFree) is unchanged.
bool allocation_or_gap(const void* p, Allocation* out, uintptr_t* gap_lo, uintptr_t* gap_hi);
uint64_t allocation_generation();

// The source line of a code address through addr2line, with the inline chain
// (race.cpp); the function's name where there is no line table.
std::string code_line(const void* pc);

// ---- the cross-stream race check (happens_before.cpp) --------------------------------
// A vector clock: per stream id, the sequence number of that stream's newest op that
// is ordered before this point. Op X (stream s, sequence q) happens before Y iff
// Y.clock[s] >= q. The runtime gives every queued op one (push): its stream's previous
// op, the events it waits for, the legacy default stream's implicit waits and what the
// host has synchronised with.
using Clock = std::vector<uint64_t>;
void join(Clock& into, const Clock& other);
// What a report calls an op: a kernel's launch site, or an API call and its caller.
struct OpSource {
  const char* name = "";
  const char* file = nullptr;  // kernels: the launch
  int line = 0;
  const void* caller = nullptr;  // copies, memsets, stand-ins: the code that called the API
  bool replayed = false;         // queued by cudaGraphLaunch (recorded by a stream capture)
};
// The name reports give stream `id` ("stream 2 (non-blocking)").
void hb_name_stream(int id, std::string name);
std::string hb_stream_name(int id);
// The runtime brackets every op it executes with these; between them the op's
// accesses (hb_access) are checked when options().stream_check.
void hb_begin_op(const OpSource& src, int stream, uint64_t seq, const Clock& clock);
void hb_end_op();
extern bool hb_running;  // an op runs under the check: hb_access has work to do
void hb_access(const void* p, size_t bytes, bool write);
// cudaFree: the allocation's history goes with it.
void hb_forget(const void* base);

}  // namespace lns::sim
