// The SIMT engine of the emulator: every CUDA thread of a block is a fiber; a block's
// fibers run cooperatively on the calling OS thread, each until it reaches a
// synchronisation (__syncthreads, a warp shuffle, a warp collective) or returns. When
// every fiber waits, the engine checks that the wait is one a GPU could complete (all
// live threads at the same barrier; all lanes named by a warp operation's mask at
// the same operation), completes it and resumes them; anything else is reported with
// the kernel, block, thread and source line.
//
// The context switch is hand-written (callee-saved registers and the stack pointer,
// ~10 instructions): glibc's swapcontext makes two signal-mask system calls per
// switch (about 1.2 us here), this one costs a few ns. Under AddressSanitizer every
// switch is announced (__sanitizer_{start,finish}_switch_fiber) so that ASan knows
// which stack is live. docs/cuda.md explains the choice.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/sim/sim_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define LNS_SIM_ASAN 1
#else
#define LNS_SIM_ASAN 0
#endif

// The builtin variables of the running thread (cuda_runtime.h).
uint3 threadIdx{0, 0, 0}, blockIdx{0, 0, 0};
dim3 blockDim, gridDim;

// lns_sim_switch(save, to): saves the callee-saved registers on the current stack,
// stores the stack pointer in *save, switches to the stack `to` and restores its
// registers. A new fiber's stack is prepared so that the first switch "returns" into
// lns_sim_trampoline with the fiber in r12 and its entry function in r13.
extern "C" void lns_sim_switch(void** save, void* to);
extern "C" void lns_sim_trampoline();
asm(R"(
  .text
  .globl lns_sim_switch
  .type lns_sim_switch,@function
lns_sim_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size lns_sim_switch,.-lns_sim_switch

  .globl lns_sim_trampoline
  .type lns_sim_trampoline,@function
lns_sim_trampoline:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size lns_sim_trampoline,.-lns_sim_trampoline
)");

namespace lns::sim {
namespace {

#if LNS_SIM_ASAN
constexpr size_t kStackBytes = size_t{512} << 10;  // instrumented frames are larger
#else
constexpr size_t kStackBytes = size_t{128} << 10;
#endif
constexpr size_t kMaxDynamicShared = 227 * 1024;

enum class Wait { Running, Barrier, Warp, Exited };

struct Thread {
  void* sp = nullptr;      // saved stack pointer while suspended
  char* stack = nullptr;   // lowest usable byte of its stack
  uint3 idx{};
  int linear = 0;
  Wait wait = Wait::Running;
  bool started = false;
  const char* file = "";  // where it waits
  int line = 0;
  // the warp operation it waits in
  bool collective = false;
  unsigned mask = 0;
  int kind = 0, arg = 0, width = 32;
  uint64_t value = 0, result = 0;
  void* lane_data = nullptr;
  void (*body)(void* const[32], void*) = nullptr;
  void* ctx = nullptr;
  const char* what = "";
#if LNS_SIM_ASAN
  void* fake_stack = nullptr;
#endif
};

// Stacks are mapped once (up to 1024) and reused by every block; a guard page below
// each turns a stack overflow into a fault instead of silent corruption.
std::vector<char*>& stack_pool() {
  static std::vector<char*> pool;
  return pool;
}
char* stack_for(int i) {
  auto& pool = stack_pool();
  while (static_cast<int>(pool.size()) <= i) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* m = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) fail("cannot map a fiber stack");
    mprotect(m, page, PROT_NONE);
    pool.push_back(static_cast<char*>(m) + page);
  }
  return pool[i];
}

char* dynamic_shared_buffer() {
  static char* buf = [] {
    void* m = mmap(nullptr, kMaxDynamicShared, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) fail("cannot map shared memory");
    return static_cast<char*>(m);
  }();
  return buf;
}

// The running block.
struct Block {
  const Grid* grid = nullptr;
  std::vector<Thread> threads;
  Thread* current = nullptr;
  void* scheduler_sp = nullptr;
  std::vector<SharedVar> shared;  // shared_of(grid), when the race check runs
#if LNS_SIM_ASAN
  void* scheduler_fake_stack = nullptr;
  const void* scheduler_stack_bottom = nullptr;
  size_t scheduler_stack_size = 0;
#endif
};
Block* g_block = nullptr;

std::string dim_str(uint3 v) {
  return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")";
}
std::string hex(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}
std::string thread_str(const Thread& t) { return "thread " + dim_str(t.idx); }
std::string site_str(const char* file, int line) { return source_path(file) + ":" + std::to_string(line); }

[[noreturn]] void fail_at(Block& b, Thread& t, const std::string& msg);

// ---- the two shared-memory regions ------------------------------------------------

// Shared memory starts undefined on a GPU: fill it with NaN bytes so that a read
// before the block wrote it gives NaN instead of the previous block's values.
void reset_shared(const Grid& g) {
  const size_t dynamic_bytes = g.shared_bytes;
  if (g.static_shared)
    for (const SharedVar& v : *g.static_shared) std::memset(v.p, 0xff, v.bytes);
  char* d = dynamic_shared_buffer();
#if LNS_SIM_ASAN
  __asan_unpoison_memory_region(d, kMaxDynamicShared);
#endif
  std::memset(d, 0xff, dynamic_bytes);
#if LNS_SIM_ASAN
  // an access past the launch's dynamic shared size is an ASan error
  __asan_poison_memory_region(d + dynamic_bytes, kMaxDynamicShared - dynamic_bytes);
#endif
}

// ---- switching ----------------------------------------------------------------------

void resume(Block& b, Thread& t) {
  b.current = &t;
  threadIdx = t.idx;
  t.wait = Wait::Running;
#if LNS_SIM_ASAN
  __sanitizer_start_switch_fiber(&b.scheduler_fake_stack, t.stack, kStackBytes);
#endif
  lns_sim_switch(&b.scheduler_sp, t.sp);
#if LNS_SIM_ASAN
  __sanitizer_finish_switch_fiber(b.scheduler_fake_stack, nullptr, nullptr);
#endif
  b.current = nullptr;
}

// From the running fiber back to the engine; returns when the engine resumes it.
void suspend(Thread& t, bool exiting) {
  Block& b = *g_block;
#if LNS_SIM_ASAN
  __sanitizer_start_switch_fiber(exiting ? nullptr : &t.fake_stack, b.scheduler_stack_bottom, b.scheduler_stack_size);
#endif
  lns_sim_switch(&t.sp, b.scheduler_sp);
#if LNS_SIM_ASAN
  __sanitizer_finish_switch_fiber(t.fake_stack, &b.scheduler_stack_bottom, &b.scheduler_stack_size);
#endif
  (void)exiting;
}

extern "C" void lns_sim_fiber_main(Thread* t) {
#if LNS_SIM_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &g_block->scheduler_stack_bottom, &g_block->scheduler_stack_size);
#endif
  g_block->grid->body();
  t->wait = Wait::Exited;
  suspend(*t, /*exiting=*/true);
  std::abort();  // never resumed
}

void start_fiber(Thread& t) {
  // Registers popped by the first switch: r15, r14, r13 (entry), r12 (argument),
  // rbx, rbp, then the return address. The trampoline's call needs rsp % 16 == 0.
  char* top = t.stack + kStackBytes;
  auto* sp = reinterpret_cast<uint64_t*>(top - 72);
  sp[0] = 0;                                                    // r15
  sp[1] = 0;                                                    // r14
  sp[2] = reinterpret_cast<uint64_t>(&lns_sim_fiber_main);      // r13
  sp[3] = reinterpret_cast<uint64_t>(&t);                       // r12
  sp[4] = 0;                                                    // rbx
  sp[5] = 0;                                                    // rbp
  sp[6] = reinterpret_cast<uint64_t>(&lns_sim_trampoline);      // return address
  t.sp = sp;
  t.started = true;
}

// Called by a fiber: record where it waits and hand control to the engine.
Thread& running(const char* what) {
  if (!g_block || !g_block->current) fail(std::string(what) + " called outside a kernel");
  return *g_block->current;
}

// ---- completing waits -----------------------------------------------------------------

int source_lane(const Thread& t, int lane) {
  const int w = t.width, base = lane & ~(w - 1);
  switch (t.kind) {
    case kShflIdx: return base + (t.arg & (w - 1));
    case kShflXor: {
      const int s = lane ^ t.arg;
      return (s & ~(w - 1)) == base ? s : lane;
    }
    case kShflDown: return (lane - base) + t.arg < w ? lane + t.arg : lane;
    case kShflUp: return (lane - base) >= t.arg ? lane - t.arg : lane;
  }
  return lane;
}

const char* wait_name(const Thread& t) {
  switch (t.wait) {
    case Wait::Barrier: return "__syncthreads";
    case Wait::Warp: return t.collective ? t.what : "a warp shuffle";
    case Wait::Exited: return "return";
    case Wait::Running: return "running";
  }
  return "?";
}
std::string where(const Thread& t) {
  if (t.wait == Wait::Exited) return thread_str(t) + " has returned";
  return thread_str(t) + " waits at " + wait_name(t) + " (" + site_str(t.file, t.line) + ")";
}

void fail_at(Block& b, Thread& t, const std::string& msg) {
  b.current = &t;
  threadIdx = t.idx;
  fail(msg);
}

// Completes every warp operation whose lanes have all arrived. Returns whether any did.
bool complete_warp_ops(Block& b) {
  bool any = false;
  const int n = static_cast<int>(b.threads.size());
  for (int w0 = 0; w0 < n; w0 += 32) {
    for (int l = 0; l < 32 && w0 + l < n; ++l) {
      Thread& t = b.threads[w0 + l];
      if (t.wait != Wait::Warp) continue;
      if (!(t.mask >> l & 1u))
        fail_at(b, t, std::string(wait_name(t)) + " at " + site_str(t.file, t.line) +
                          ": the calling lane is not in its mask");
      // every lane of the mask must wait at this very operation with the same mask
      Thread* lanes[32] = {};
      for (int k = 0; k < 32; ++k) {
        if (!(t.mask >> k & 1u)) continue;
        if (w0 + k >= n)
          fail_at(b, t, std::string(wait_name(t)) + " at " + site_str(t.file, t.line) + ": mask names lane " +
                            std::to_string(k) + " but the block has " + std::to_string(n) +
                            " threads (blockDim a multiple of 32 is assumed)");
        Thread& o = b.threads[w0 + k];
        if (o.wait != Wait::Warp || o.file != t.file || o.line != t.line || o.collective != t.collective ||
            o.mask != t.mask) {
          fail_at(b, t, std::string(wait_name(t)) + " at " + site_str(t.file, t.line) +
                            " with mask " + hex(t.mask) + ": lane " + std::to_string(k) +
                            " is not converged (" + where(o) + ")");
        }
        lanes[k] = &o;
      }
      if (t.collective) {
        void* data[32] = {};
        for (int k = 0; k < 32; ++k)
          if (lanes[k]) data[k] = lanes[k]->lane_data;
        b.current = &t;
        threadIdx = t.idx;
        t.body(data, t.ctx);
        b.current = nullptr;
      } else {
        for (int k = 0; k < 32; ++k) {
          if (!lanes[k]) continue;
          const int src = source_lane(*lanes[k], k);
          if (!lanes[src])
            fail_at(b, *lanes[k], "warp shuffle at " + site_str(t.file, t.line) + " reads lane " +
                                      std::to_string(src) + ", which is not in the mask");
          lanes[k]->result = lanes[src]->value;
        }
      }
      for (int k = 0; k < 32; ++k)
        if (lanes[k]) lanes[k]->wait = Wait::Running;
      any = true;
    }
  }
  return any;
}

// Every thread waits: either all live ones are at one __syncthreads (release them),
// or the block cannot go on as written.
void complete_barrier(Block& b) {
  Thread* first = nullptr;
  Thread* exited = nullptr;
  for (Thread& t : b.threads) {
    if (t.wait == Wait::Exited) {
      if (!exited) exited = &t;
      continue;
    }
    if (t.wait == Wait::Warp)
      fail_at(b, t, std::string(wait_name(t)) + " at " + site_str(t.file, t.line) + " can never complete");
    if (!first) {
      first = &t;
    } else if (t.file != first->file || t.line != first->line) {
      fail_at(b, t, "divergent __syncthreads: " + where(t) + " while " + where(*first));
    }
  }
  if (!first) return;
  if (exited)
    fail_at(b, *first, "__syncthreads at " + site_str(first->file, first->line) + " is not reached by every thread: " +
                           thread_str(*exited) + " has already returned");
  for (Thread& t : b.threads) t.wait = Wait::Running;
  if (options().race_check) race_barrier();
}

// Every stretch of shared memory the grid's blocks have, for the race check.
std::vector<SharedVar> shared_of(const Grid& g) {
  std::vector<SharedVar> out;
  if (g.static_shared) out = *g.static_shared;
  if (g.shared_bytes) out.push_back({dynamic_shared_buffer(), g.shared_bytes, "dynamic"});
  return out;
}

void run_block(Block& b, uint3 block_idx, bool reversed) {
  const Grid& g = *b.grid;
  blockIdx = block_idx;
  const int n = static_cast<int>(g.block.x * g.block.y * g.block.z);
  b.threads.assign(n, Thread{});
  for (int i = 0; i < n; ++i) {
    Thread& t = b.threads[i];
    t.linear = i;
    t.idx = uint3{i % g.block.x, (i / g.block.x) % g.block.y, i / (g.block.x * g.block.y)};
    t.stack = stack_for(i);
#if LNS_SIM_ASAN
    __asan_unpoison_memory_region(t.stack, kStackBytes);  // what a previous fiber left
#endif
    start_fiber(t);
  }
  reset_shared(g);
  const bool race = options().race_check;
  if (race) race_begin_block(b.shared);
  for (;;) {
    bool ran = false;
    for (int k = 0; k < n; ++k) {
      Thread& t = b.threads[reversed ? n - 1 - k : k];
      if (t.wait != Wait::Running) continue;
      if (race) race_resume(t.linear);
      resume(b, t);
      if (race) {
        b.current = &t;  // a report names this thread
        race_after_slice(t.file, t.line);
        b.current = nullptr;
      }
      ran = true;
    }
    if (complete_warp_ops(b)) continue;
    bool all_exited = true;
    for (const Thread& t : b.threads) all_exited &= t.wait == Wait::Exited;
    if (all_exited) {
      if (race) race_end_block();
      return;
    }
    (void)ran;
    complete_barrier(b);
  }
}

}  // namespace

void run_grid(const Grid& g, bool reversed) {
  Block b;
  b.grid = &g;
  Block* outer = g_block;
  if (outer) fail("a kernel launched from inside a kernel");
  g_block = &b;
  if (options().race_check) b.shared = shared_of(g);
  gridDim = g.grid;
  blockDim = g.block;
  const uint64_t nx = g.grid.x, ny = g.grid.y, nz = g.grid.z, count = nx * ny * nz;
  for (uint64_t k = 0; k < count; ++k) {
    const uint64_t i = reversed ? count - 1 - k : k;
    run_block(b, uint3{unsigned(i % nx), unsigned((i / nx) % ny), unsigned(i / (nx * ny))}, reversed);
  }
  g_block = nullptr;
}

std::string kernel_context() {
  if (!g_block) return "";
  const Grid& g = *g_block->grid;
  std::string s = "kernel " + std::string(g.site.kernel) + " (launched at " + site_str(g.site.file, g.site.line) +
                  ") block " + dim_str(blockIdx);
  if (g_block->current) s += " " + thread_str(*g_block->current);
  return s;
}

void* dynamic_shared() {
  running("extern __shared__");
  return dynamic_shared_buffer();
}

void syncthreads(const char* file, int line) {
  Thread& t = running("__syncthreads");
  t.wait = Wait::Barrier;
  t.file = file, t.line = line;
  suspend(t, false);
}

uint64_t shfl(unsigned mask, uint64_t value, int kind, int arg, int width, const char* file, int line) {
  Thread& t = running("a warp shuffle");
  if (width <= 0 || width > 32 || (width & (width - 1)))
    fail("warp shuffle at " + site_str(file, line) + ": width " + std::to_string(width) + " is not a power of 2 <= 32");
  t.wait = Wait::Warp;
  t.collective = false;
  t.file = file, t.line = line;
  t.mask = mask, t.kind = kind, t.arg = arg, t.width = width, t.value = value;
  suspend(t, false);
  return t.result;
}

void warp_collective(unsigned mask, void* lane_data, void (*body)(void* const lanes[32], void* ctx), void* ctx,
                     const char* what) {
  Thread& t = running(what);
  t.wait = Wait::Warp;
  t.collective = true;
  t.file = what, t.line = 0;
  t.mask = mask, t.lane_data = lane_data, t.body = body, t.ctx = ctx, t.what = what;
  suspend(t, false);
}

}  // namespace lns::sim
