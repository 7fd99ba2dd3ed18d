// The emulator's cross-stream race check (LNS_SIM_CHECKS=streams; docs/cuda.md): a
// happens-before check over device memory. Two ops that touch the same device bytes,
// at least one of them writing, must be ordered by what the program declared: stream
// order, an event recorded after one and waited for before the other, the legacy
// default stream's implicit waits, or a host synchronisation between them. The order
// the emulator happened to run them in does not count, so queued work that a query or
// a host read ran early cannot make an unordered op look safe.
//
// How: every op carries a vector clock (Clock, made by the runtime when it is queued:
// runtime.cpp push). Op X (stream s, sequence number q) happens before op Y iff
// Y.clock[s] >= q. Every 4-byte granule of a device allocation that some op touched
// keeps its last writer and up to two readers since that write (FastTrack's shadow
// state, with readers that are ordered before a newer one dropped). Each access of a
// running op is checked against them:
//   a read  must be ordered after the granule's last write;
//   a write must be ordered after its last write and after every read since.
// Who sees accesses: kernels through the access hooks (race.cpp: every load and store
// of the Release emulation build's kernels); copies, memsets and the cuBLASLt and
// NCCL stand-ins declare theirs (sim_api.h declare_access). Under ASan the kernels
// have no hooks, so only the declared accesses are checked there.
//
// No false report on correctly ordered code: the clock is exactly the declared order,
// and a granule is 4 bytes, so a false one would need two tensors written by unordered
// streams to share a 4-byte word (allocations are 256-byte aligned, flat buffers padded
// per tensor, pool carvings aligned). It can miss (a third concurrent reader stream of
// one granule evicts the oldest one), never invent otherwise.
#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda/sim/sim_internal.h"

namespace lns::sim {

bool hb_running = false;

void join(Clock& into, const Clock& other) {
  if (into.size() < other.size()) into.resize(other.size(), 0);
  for (size_t i = 0; i < other.size(); ++i)
    if (other[i] > into[i]) into[i] = other[i];
}

namespace {

constexpr size_t kGranule = 4;

// An op that touched device memory, for the shadow cells and the reports. Index 0 is
// no op; the index grows in the order the emulator ran them.
struct OpRecord {
  OpSource src;
  int stream = 0;
  uint64_t seq = 0;
};
std::vector<OpRecord> g_ops(1);

// The running op.
struct Running {
  OpSource src;
  int stream = 0;
  uint64_t seq = 0;
  const Clock* clock = nullptr;
  uint32_t id = 0;  // in g_ops once it touched something
};
std::vector<Running> g_running;  // a stack: an op never runs another, but be safe

std::vector<std::string>& stream_names() {
  static std::vector<std::string> v;
  return v;
}

struct Cell {
  uint32_t writer = 0;
  uint32_t reader[2] = {0, 0};
};
std::unordered_map<uintptr_t, std::vector<Cell>>& shadows() {
  static auto* m = new std::unordered_map<uintptr_t, std::vector<Cell>>();
  return *m;
}

// The allocation of the last hit, and the last stretch between allocations that
// missed (fiber stacks, host memory): most accesses fall in one of the two.
struct Cache {
  uint64_t generation = ~uint64_t{0};
  Allocation hit;
  Cell* cells = nullptr;
  uintptr_t gap_lo = 0, gap_hi = 0;
};
Cache g_cache;

std::string stream_name(int id) {
  const auto& n = stream_names();
  return id >= 0 && size_t(id) < n.size() ? n[size_t(id)] : "stream #" + std::to_string(id);
}

std::string describe(const OpSource& s, int stream) {
  std::string what = s.name ? s.name : "an op";
  if (s.file) {
    what = std::string("kernel ") + what + " (launched at " + source_path(s.file) + ":" + std::to_string(s.line);
    what += s.replayed ? ", replayed by cudaGraphLaunch)" : ")";
  } else {
    if (s.caller) what += " (called from " + code_line(s.caller) + ")";
    if (s.replayed) what += " (replayed by cudaGraphLaunch)";
  }
  return what + " on " + stream_name(stream);
}

uint32_t current_id() {
  Running& r = g_running.back();
  if (!r.id) {
    r.id = static_cast<uint32_t>(g_ops.size());
    g_ops.push_back(OpRecord{r.src, r.stream, r.seq});
  }
  return r.id;
}

bool ordered_before_current(uint32_t other) {
  const Running& r = g_running.back();
  if (other == r.id) return true;
  const OpRecord& o = g_ops[other];
  return size_t(o.stream) < r.clock->size() && (*r.clock)[size_t(o.stream)] >= o.seq;
}

// `a` by value: the strings below may run library code that the linker took from an
// instrumented kernel file, whose hooks come back to hb_access (and its cache).
[[noreturn]] void report(uint32_t other, bool other_wrote, bool wrote, const Allocation a, size_t offset, size_t n) {
  hb_running = false;
  const Running& r = g_running.back();
  const OpRecord& o = g_ops[other];
  // In the order the program queued them: the missing ordering puts the later one
  // after the earlier one.
  const bool current_first = r.seq < o.seq;
  const std::string cur = describe(r.src, r.stream), oth = describe(o.src, o.stream);
  const std::string& first = current_first ? cur : oth;
  const std::string& second = current_first ? oth : cur;
  const char* first_did = (current_first ? wrote : other_wrote) ? "wrote" : "read";
  const char* second_did = (current_first ? other_wrote : wrote) ? "wrote" : "read";
  const int first_stream = current_first ? r.stream : o.stream, second_stream = current_first ? o.stream : r.stream;
  char where[160];
  std::snprintf(where, sizeof where, "bytes [%zu, %zu) of the %zu-byte device allocation at %p", offset, offset + n,
                a.bytes, static_cast<void*>(a.base));
  fail(std::string("cross-stream race on ") + where + ": " + first + " " + first_did + " them, then " + second +
       " " + second_did + " them, and nothing orders the two: no event recorded on " + stream_name(first_stream) +
       " after the first is waited for (cudaStreamWaitEvent) on " + stream_name(second_stream) +
       " before the second, and the host did not synchronise with " + stream_name(first_stream) +
       " between queueing them (the emulator ran the " + (current_first ? "second" : "first") + " one first)");
}

}  // namespace

void hb_name_stream(int id, std::string name) {
  auto& n = stream_names();
  if (size_t(id) >= n.size()) n.resize(size_t(id) + 1);
  n[size_t(id)] = std::move(name);
}

std::string hb_stream_name(int id) { return stream_name(id); }

void hb_begin_op(const OpSource& src, int stream, uint64_t seq, const Clock& clock) {
  g_running.push_back(Running{src, stream, seq, &clock, 0});
  hb_running = options().stream_check;
}

void hb_end_op() {
  g_running.pop_back();
  hb_running = !g_running.empty() && options().stream_check;
}

void hb_forget(const void* base) {
  shadows().erase(reinterpret_cast<uintptr_t>(base));
  g_cache.generation = ~uint64_t{0};
}

void hb_access(const void* p, size_t n, bool write) {
  if (!hb_running || n == 0) return;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  Cache& c = g_cache;
  if (c.generation != allocation_generation()) {
    c = Cache{};
    c.generation = allocation_generation();
  }
  if (addr - reinterpret_cast<uintptr_t>(c.hit.base) >= c.hit.bytes || !c.cells) {
    if (addr - c.gap_lo < c.gap_hi - c.gap_lo) return;
    uintptr_t lo = 0, hi = 0;
    if (!allocation_or_gap(p, &c.hit, &lo, &hi)) {
      c.gap_lo = lo, c.gap_hi = hi, c.hit = Allocation{}, c.cells = nullptr;
      return;
    }
    std::vector<Cell>& cells = shadows()[reinterpret_cast<uintptr_t>(c.hit.base)];
    if (cells.empty()) cells.resize((c.hit.bytes + kGranule - 1) / kGranule);
    c.cells = cells.data();
  }
  const size_t offset = addr - reinterpret_cast<uintptr_t>(c.hit.base);
  const size_t len = std::min(n, c.hit.bytes - offset);
  const uint32_t me = current_id();
  const int my_stream = g_running.back().stream;
  for (size_t g = offset / kGranule; g <= (offset + len - 1) / kGranule; ++g) {
    Cell& cell = c.cells[g];
    if (write) {
      if (cell.writer == me && !cell.reader[0] && !cell.reader[1]) continue;
      if (cell.writer && !ordered_before_current(cell.writer)) report(cell.writer, true, true, c.hit, offset, len);
      for (uint32_t r : cell.reader)
        if (r && !ordered_before_current(r)) report(r, false, true, c.hit, offset, len);
      cell = Cell{me, {0, 0}};
    } else {
      if (cell.writer == me || cell.reader[0] == me || cell.reader[1] == me) continue;
      if (cell.writer && !ordered_before_current(cell.writer)) report(cell.writer, true, false, c.hit, offset, len);
      // Keep one reader per stream where possible: a reader ordered before this one is
      // covered by it (a write ordered after this read is ordered after that one too).
      uint32_t* slot = nullptr;
      for (uint32_t& r : cell.reader)
        if (!r || g_ops[r].stream == my_stream || ordered_before_current(r)) {
          slot = &r;
          break;
        }
      if (!slot) cell.reader[1] = cell.reader[0], slot = &cell.reader[0];  // evict the older: may miss, never invents
      *slot = me;
    }
  }
}

}  // namespace lns::sim
