// The emulator's shared-memory race check (LNS_SIM_CHECKS=race; docs/cuda.md): within
// one barrier epoch of a block (between two __syncthreads), a shared-memory byte that
// one thread writes may not be read or written by another thread. That is the rule;
// there are two ways of seeing the accesses, depending on how the kernels were built:
//
// - access hooks (the Release emulation build, LNS_SANITIZE=OFF): the kernel sources
//   are compiled with GCC's ThreadSanitizer instrumentation (-fsanitize=thread) but
//   linked without its runtime: every load and store the compiler keeps calls one of
//   the __tsan_{read,write}N functions defined below. They ignore every address outside
//   the running block's shared memory (two compares) and keep, for each shared byte,
//   the epoch's writer and its last two distinct readers, so a read of a byte another
//   thread wrote (read after write), a write of a byte another thread read (write
//   after read) or wrote (write-write) is reported at the access, with the source lines
//   of both accesses (the return address of the hook, through addr2line).
// - snapshots (the ASan build: GCC refuses -fsanitize=thread next to
//   -fsanitize=address): the bytes of shared memory each fiber changed while it ran are
//   attributed to it; only write-write races are seen (a read-write race whose value
//   matters is left to the reversed-order run).
#include <link.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/sim/sim_internal.h"

namespace lns::sim {
namespace {

// The shared memory being watched, as one index space: its stretches (static
// section, dynamic bytes, template kernels' variables) one after the other. Empty
// when no block runs under the check, so that every hook returns at once.
struct Region {
  uintptr_t lo = 0;
  size_t n = 0;
  size_t first = 0;  // index of its first byte
  std::string name;
};
constexpr int kMaxRegions = 16;
Region g_regions[kMaxRegions];
int g_nregions = 0;
size_t g_watched = 0;  // bytes in all regions
int g_thread = -1;       // linear index of the running fiber
uint32_t g_epoch = 1;    // bumped at every block start and completed barrier
bool g_hooks = false;    // some kernel code was compiled with the access hooks

// Per shared byte: who touched it in epoch `epoch` (older epochs count as untouched).
struct Shadow {
  uint32_t epoch = 0;
  int16_t writer = -1, reader = -1, reader2 = -1;  // reader2: the previous distinct reader
  const void* wpc = nullptr;
  const void* rpc = nullptr;
  const void* rpc2 = nullptr;
};
std::vector<Shadow> g_shadow;

// Snapshot mode: the writer of each byte (valid only in the epoch it records, so that
// a barrier forgets every writer by bumping g_epoch instead of clearing the array) and
// shared memory as it was when the running fiber was resumed.
struct Writer {
  uint32_t epoch = 0;
  int thread = -1;
};
std::vector<Writer> g_writer;
std::vector<char> g_snapshot;

// The first offset below n where a and b differ (compared 8 bytes at a time); n when
// none does. Called after every fiber slice over every watched byte, it is most of
// the check's time: hence not memcmp, which ASan intercepts and checks at every call
// (80% of an ASan test's time under the check went there), and optimised whatever the
// build's level. Both buffers belong to the emulator (a block's shared memory, the
// snapshot).
__attribute__((no_sanitize("address"), optimize("O2"))) size_t first_difference(const char* a, const char* b,
                                                                                size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x, y;
    __builtin_memcpy(&x, a + i, 8);
    __builtin_memcpy(&y, b + i, 8);
    if (x != y) break;
  }
  for (; i < n; ++i)
    if (a[i] != b[i]) return i;
  return n;
}

std::string thread_name(int linear) {
  const unsigned x = blockDim.x, y = blockDim.y;
  return "thread (" + std::to_string(linear % x) + "," + std::to_string((linear / x) % y) + "," +
         std::to_string(linear / (x * y)) + ")";
}
std::string byte_name(size_t index) {
  for (int r = 0; r < g_nregions; ++r) {
    const Region& g = g_regions[r];
    if (index - g.first >= g.n) continue;
    const std::string at = std::to_string(index - g.first);
    if (g.name.empty()) return "a static __shared__ byte (offset " + at + ")";
    if (g.name == "dynamic") return "dynamic shared byte " + at;
    return "byte " + at + " of __shared__ " + g.name;
  }
  return "shared byte " + std::to_string(index);
}

// The source line of a code address: addr2line on the object that holds it, with
// the inline chain ("common.cuh:80 inlined in norm.cu:41"). The hooks' callers are
// built with -g1 (line tables); without them the function name is all there is.
struct Object {
  uintptr_t pc = 0, bias = 0;
  std::string path;
};
int find_object(dl_phdr_info* info, size_t, void* data) {
  auto* o = static_cast<Object*>(data);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    if (o->pc >= lo && o->pc < lo + ph.p_memsz) {
      o->bias = info->dlpi_addr;
      o->path = info->dlpi_name && *info->dlpi_name ? info->dlpi_name : "";
      if (o->path.empty()) {  // the main program (its own path: /proc/self/exe would be addr2line's)
        char exe[4096];
        const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        o->path = n > 0 ? std::string(exe, size_t(n)) : "";
      }
      return 1;
    }
  }
  return 0;
}
}  // namespace

std::string code_line(const void* pc) {
  char addr[32];
  std::snprintf(addr, sizeof addr, "%p", pc);
  if (!pc) return "?";
  Object o;
  o.pc = reinterpret_cast<uintptr_t>(pc) - 1;  // the call, not the instruction after it
  if (!dl_iterate_phdr(find_object, &o)) return addr;
  char cmd[512];
  std::snprintf(cmd, sizeof cmd, "addr2line -f -C -i -e '%s' 0x%lx 2>/dev/null", o.path.c_str(),
                static_cast<unsigned long>(o.pc - o.bias));
  FILE* p = popen(cmd, "r");
  if (!p) return addr;
  std::vector<std::string> lines;
  char buf[1024];
  while (std::fgets(buf, sizeof buf, p)) {
    std::string s(buf);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    lines.push_back(s);
  }
  pclose(p);
  std::string out;
  for (size_t i = 0; i + 1 < lines.size(); i += 2) {  // (function, file:line) pairs, innermost first
    std::string where = lines[i + 1];
    const size_t disc = where.find(" (discriminator");
    if (disc != std::string::npos) where.resize(disc);
    if (where.rfind("??", 0) == 0) where = lines[i] + " (no line table)";
    out += (out.empty() ? "" : " inlined in ") + source_path(where);
  }
  return out.empty() ? addr : out;
}

namespace {

// The three kinds of race, as the report words them.
enum class Race { WriteWrite, ReadAfterWrite, WriteAfterRead };
[[noreturn]] void report(Race kind, int other, size_t index, const void* pc, const void* other_pc) {
  const std::string me = thread_name(g_thread), them = thread_name(other), where = byte_name(index);
  const std::string no_barrier = " with no __syncthreads between them (";
  switch (kind) {
    case Race::WriteWrite:
      fail("shared-memory race: " + me + " and " + them + " both wrote " + where + no_barrier + "this write at " +
           code_line(pc) + ", the other at " + code_line(other_pc) + ")");
    case Race::ReadAfterWrite:
      fail("shared-memory race: " + me + " read " + where + " that " + them + " wrote" + no_barrier + "the read at " +
           code_line(pc) + ", the write at " + code_line(other_pc) + ")");
    case Race::WriteAfterRead:
      fail("shared-memory race: " + me + " wrote " + where + " that " + them + " read" + no_barrier + "the write at " +
           code_line(pc) + ", the read at " + code_line(other_pc) + ")");
  }
  fail("shared-memory race");
}

// One access of n bytes at a by the running fiber, from code address pc.
inline void access(const void* p, size_t n, bool write, const void* pc) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  size_t index = 0, room = 0;
  for (int r = 0; r < g_nregions; ++r) {
    if (a - g_regions[r].lo < g_regions[r].n) {
      index = g_regions[r].first + (a - g_regions[r].lo), room = g_regions[r].n - (a - g_regions[r].lo);
      break;
    }
  }
  if (!room) {  // not shared memory: device memory, for the cross-stream check
    if (hb_running) hb_access(p, n, write);
    return;
  }
  if (g_thread < 0) return;  // the engine itself (never instrumented; defensive)
  const auto t = static_cast<int16_t>(g_thread);
  for (size_t i = index; i < index + std::min(n, room); ++i) {
    Shadow& s = g_shadow[i];
    if (s.epoch != g_epoch) s = Shadow{g_epoch};
    if (write) {
      if (s.writer >= 0 && s.writer != t) report(Race::WriteWrite, s.writer, i, pc, s.wpc);
      if (s.reader >= 0 && s.reader != t) report(Race::WriteAfterRead, s.reader, i, pc, s.rpc);
      if (s.reader2 >= 0 && s.reader2 != t) report(Race::WriteAfterRead, s.reader2, i, pc, s.rpc2);
      s.writer = t, s.wpc = pc;
    } else {
      if (s.writer >= 0 && s.writer != t) report(Race::ReadAfterWrite, s.writer, i, pc, s.wpc);
      if (s.reader != t) s.reader2 = s.reader, s.rpc2 = s.rpc, s.reader = t;
      s.rpc = pc;
    }
  }
}

}  // namespace

bool race_sees_reads() { return g_hooks; }

void race_begin_block(const std::vector<SharedVar>& shared) {
  if (static_cast<int>(shared.size()) > kMaxRegions) fail("race check: more than 16 stretches of shared memory");
  g_nregions = 0, g_watched = 0;
  for (const SharedVar& v : shared) {
    g_regions[g_nregions++] = Region{reinterpret_cast<uintptr_t>(v.p), v.bytes, g_watched, v.name};
    g_watched += v.bytes;
  }
  g_thread = -1;
  if (g_hooks) {
    if (g_shadow.size() < g_watched) g_shadow.resize(g_watched);
  } else {
    g_snapshot.resize(g_watched);
    for (int r = 0; r < g_nregions; ++r)
      std::memcpy(g_snapshot.data() + g_regions[r].first, reinterpret_cast<const char*>(g_regions[r].lo),
                  g_regions[r].n);
    if (g_writer.size() < g_watched) g_writer.resize(g_watched);  // older epochs count as unwritten
  }
  race_barrier();
}

void race_end_block() {
  g_nregions = 0, g_watched = 0;
  g_thread = -1;
}

void race_resume(int linear) { g_thread = linear; }

void race_barrier() {
  if (++g_epoch == 0) {  // wrapped: forget every byte's epoch
    g_shadow.assign(g_shadow.size(), Shadow{});
    g_writer.assign(g_writer.size(), Writer{});
    g_epoch = 1;
  }
}

void race_after_slice(const char* waited_file, int waited_line) {
  if (g_hooks || g_watched == 0) return;
  const auto scan = [&](const char* lo, size_t n, size_t offset) {
    char* snap = g_snapshot.data() + offset;
    for (size_t i = first_difference(lo, snap, n); i < n;
         i += 1 + first_difference(lo + i + 1, snap + i + 1, n - i - 1)) {
      Writer& w = g_writer[offset + i];
      if (w.epoch == g_epoch && w.thread != g_thread)
        fail("shared-memory race: " + thread_name(g_thread) + " and " + thread_name(w.thread) + " both wrote " +
             byte_name(offset + i) + " with no __syncthreads between them (" + thread_name(g_thread) +
             " last waited at " + source_path(waited_file) + ":" + std::to_string(waited_line) + ")");
      w = Writer{g_epoch, g_thread};
      snap[i] = lo[i];
    }
  };
  for (int r = 0; r < g_nregions; ++r)
    scan(reinterpret_cast<const char*>(g_regions[r].lo), g_regions[r].n, g_regions[r].first);
}

}  // namespace lns::sim

// ---- the hooks the instrumented kernel code calls ---------------------------------------
// The names and signatures are those GCC's -fsanitize=thread emits (its builtins, which
// GCC also declares in an ASan build: there the hooks are left out, as no kernel calls
// them). This is not ThreadSanitizer (its runtime is not linked), only its
// instrumentation put to use. CMake defines LNS_SIM_ACCESS_HOOKS where the kernels
// carry the instrumentation.
#ifdef LNS_SIM_ACCESS_HOOKS
#define LNS_SIM_HOOK extern "C" __attribute__((visibility("default"), used))
LNS_SIM_HOOK void __tsan_init() { lns::sim::g_hooks = true; }
#define LNS_SIM_ACCESS(n)                                                                                   \
  LNS_SIM_HOOK void __tsan_read##n(void* p) { lns::sim::access(p, n, false, __builtin_return_address(0)); } \
  LNS_SIM_HOOK void __tsan_write##n(void* p) { lns::sim::access(p, n, true, __builtin_return_address(0)); } \
  LNS_SIM_HOOK void __tsan_unaligned_read##n(void* p) {                                                     \
    lns::sim::access(p, n, false, __builtin_return_address(0));                                             \
  }                                                                                                         \
  LNS_SIM_HOOK void __tsan_unaligned_write##n(void* p) { lns::sim::access(p, n, true, __builtin_return_address(0)); }
LNS_SIM_ACCESS(1)
LNS_SIM_ACCESS(2)
LNS_SIM_ACCESS(4)
LNS_SIM_ACCESS(8)
LNS_SIM_ACCESS(16)
LNS_SIM_HOOK void __tsan_read_range(void* p, long n) {
  lns::sim::access(p, size_t(n), false, __builtin_return_address(0));
}
LNS_SIM_HOOK void __tsan_write_range(void* p, long n) {
  lns::sim::access(p, size_t(n), true, __builtin_return_address(0));
}
// Never called: the kernels are compiled without function entry/exit instrumentation
// (--param=tsan-instrument-func-entry-exit=0); defined so that a TU built without the
// param still links.
LNS_SIM_HOOK void __tsan_func_entry(void*) {}
LNS_SIM_HOOK void __tsan_func_exit(void*) {}
// Stores and loads of a C++ object's vtable pointer (gtest's classes in the test
// files): never shared memory.
LNS_SIM_HOOK void __tsan_vptr_update(void*, void*) {}
LNS_SIM_HOOK void __tsan_vptr_read(void*) {}
// Atomic operations in instrumented code (host code of the kernel files: the guard of
// a function-local static, reference counts in library headers). GCC passes the
// memory order as __ATOMIC_*; these do the operation with sequential consistency,
// at least the order asked for. Not part of the race check.
#define LNS_SIM_ATOMIC_RMW(bits, T, op)                                       \
  LNS_SIM_HOOK T __tsan_atomic##bits##_##op(volatile void* p, T v, int) {    \
    return __atomic_##op(static_cast<volatile T*>(p), v, __ATOMIC_SEQ_CST); \
  }
#define LNS_SIM_ATOMIC(bits, T)                                                                        \
  LNS_SIM_HOOK T __tsan_atomic##bits##_load(const volatile void* p, int) {                            \
    return __atomic_load_n(static_cast<const volatile T*>(p), __ATOMIC_SEQ_CST);                      \
  }                                                                                                   \
  LNS_SIM_HOOK void __tsan_atomic##bits##_store(volatile void* p, T v, int) {                         \
    __atomic_store_n(static_cast<volatile T*>(p), v, __ATOMIC_SEQ_CST);                               \
  }                                                                                                   \
  LNS_SIM_HOOK T __tsan_atomic##bits##_exchange(volatile void* p, T v, int) {                         \
    return __atomic_exchange_n(static_cast<volatile T*>(p), v, __ATOMIC_SEQ_CST);                     \
  }                                                                                                   \
  LNS_SIM_ATOMIC_RMW(bits, T, fetch_add)                                                              \
  LNS_SIM_ATOMIC_RMW(bits, T, fetch_sub)                                                              \
  LNS_SIM_ATOMIC_RMW(bits, T, fetch_and)                                                              \
  LNS_SIM_ATOMIC_RMW(bits, T, fetch_or)                                                               \
  LNS_SIM_ATOMIC_RMW(bits, T, fetch_xor)                                                              \
  LNS_SIM_HOOK bool __tsan_atomic##bits##_compare_exchange_strong(volatile void* p, void* c, T v, int, \
                                                                  int) {                              \
    return __atomic_compare_exchange_n(static_cast<volatile T*>(p), static_cast<T*>(c), v, false,     \
                                       __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                           \
  }                                                                                                   \
  LNS_SIM_HOOK bool __tsan_atomic##bits##_compare_exchange_weak(volatile void* p, void* c, T v, int,   \
                                                                int) {                                \
    return __atomic_compare_exchange_n(static_cast<volatile T*>(p), static_cast<T*>(c), v, false,     \
                                       __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                           \
  }                                                                                                   \
  LNS_SIM_HOOK T __tsan_atomic##bits##_compare_exchange_val(volatile void* p, T c, T v, int, int) {   \
    __atomic_compare_exchange_n(static_cast<volatile T*>(p), &c, v, false, __ATOMIC_SEQ_CST,          \
                                __ATOMIC_SEQ_CST);                                                    \
    return c;                                                                                         \
  }
LNS_SIM_ATOMIC(8, uint8_t)
LNS_SIM_ATOMIC(16, uint16_t)
LNS_SIM_ATOMIC(32, uint32_t)
LNS_SIM_ATOMIC(64, uint64_t)
LNS_SIM_HOOK void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
LNS_SIM_HOOK void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
#endif  // LNS_SIM_ACCESS_HOOKS
