// The host side of the emulated CUDA runtime: devices (H100 properties), device
// memory (one host allocation per cudaMalloc, so AddressSanitizer sees overruns),
// streams and events (work is queued and runs at synchronisation points, in an
// adversarial but legal order), kernel launches (limits and pointer arguments
// checked at the launch) and the error reporting of every check.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cuda/pool.h"
#include "cuda/sim/counters.h"
#include "cuda/sim/sim_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

// ---- streams and events -------------------------------------------------------------

struct Op {
  uint64_t seq = 0;  // global enqueue order
  lns::sim::OpSource src;  // its name (src.name) and where it came from, for reports
  lns::sim::Clock clock;   // what it is ordered after (happens_before.cpp)
  std::function<void()> fn;
  int device = 0;
  // must not start before these streams completed these sequence numbers
  std::vector<std::pair<CUstream_st*, uint64_t>> after;
  // for cudaEventRecord: the event this op completes
  CUevent_st* records = nullptr;
  uint64_t record_id = 0;
};

namespace lns::sim {
// A query of pending work (cudaStreamQuery, cudaEventQuery) answers NotReady twice (the
// GPU is busy: a polling loop runs at least one round even after a caller's own
// query), then runs the work and answers done, as a GPU finishes eventually; a loop
// that polls until done would never end if queries only looked.
struct BusyAnswers {
  uint64_t state = 0;  // the pending work they were for (seq or record id)
  int given = 0;
  bool busy(uint64_t pending) {
    if (state != pending) state = pending, given = 0;
    return given++ < 2;
  }
};
}  // namespace lns::sim

// A CUDA graph as stream capture records it: the ops, in the order they were queued.
struct CapturedOp {
  lns::sim::OpSource src;
  std::function<void()> fn;
};
struct CUgraph_st {
  int device = 0;
  std::vector<CapturedOp> ops;
};
struct CUgraphExec_st {
  int device = 0;
  std::vector<CapturedOp> ops;
};

struct CUstream_st {
  CUgraph_st* capture = nullptr;  // recording a graph (cudaStreamBeginCapture): ops go there
  int id = 0;             // index into every Clock
  lns::sim::Clock clock;  // of its newest op
  int device = 0;
  bool legacy = false;    // the legacy default stream of `device`
  bool blocking = true;   // synchronises with the legacy default stream
  std::deque<Op> queue;
  uint64_t last_enqueued = 0;  // seq of the newest op (0: none yet)
  uint64_t completed = 0;      // seq of the newest completed op
  lns::sim::BusyAnswers busy;  // cudaStreamQuery's NotReady answers for the pending work
};

struct CUevent_st {
  CUstream_st* stream = nullptr;  // of the latest record (null: never recorded)
  uint64_t seq = 0;               // that stream must complete this op
  uint64_t record_id = 0, completed_id = 0;
  lns::sim::BusyAnswers busy;     // cudaEventQuery's NotReady answers for the pending record
  double time_ms = 0;
  lns::sim::Clock clock;          // of the latest record: what a wait on it is ordered after
};

namespace lns::sim {
namespace {

constexpr size_t kTotalMemory = size_t{80} << 30;  // an H100 80 GB
constexpr int kSms = 132;
constexpr size_t kSharedDefault = 48 * 1024, kSharedOptin = 227 * 1024;

std::recursive_mutex& mu() {
  static std::recursive_mutex m;
  return m;
}

int device_count() {
  static const int n = [] {
    const char* v = std::getenv("LNS_SIM_DEVICES");
    if (!v || !*v) return 8;
    char* end = nullptr;
    const long k = std::strtol(v, &end, 10);
    if (*end != '\0' || k < 0 || k > 64) {
      std::fprintf(stderr, "lns-sim: LNS_SIM_DEVICES must be a device count 0..64, got '%s'\n", v);
      std::exit(2);
    }
    return static_cast<int>(k);
  }();
  return n;
}

thread_local int t_device = 0;
thread_local cudaError_t t_last_error = cudaSuccess;

cudaError_t set_error(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

// ---- device memory -------------------------------------------------------------------

struct Registry {
  std::map<uintptr_t, Allocation> live;  // by base address
  uint64_t generation = 0;               // bumped by every change of `live`
  std::vector<size_t> in_use, peak;       // per device
  Registry() : in_use(64, 0), peak(64, 0) {}
};
Registry& registry() {
  static Registry* r = new Registry();  // outlives static destructors that free
  return *r;
}

// ---- streams -------------------------------------------------------------------------

uint64_t g_seq = 0;
std::vector<CUstream_st*>& streams() {
  static std::vector<CUstream_st*> s;
  return s;
}
// A new stream: its clock index and the name reports give it.
void add_stream(CUstream_st* s) {
  static int next_id = 0;
  s->id = next_id++;
  std::string name = s->legacy ? "the legacy default stream" : "stream " + std::to_string(s->id);
  if (!s->legacy && !s->blocking) name += " (non-blocking)";
  if (s->device) name += " of device " + std::to_string(s->device);
  hb_name_stream(s->id, name);
  streams().push_back(s);
}
CUstream_st* legacy_stream(int device) {
  static std::vector<CUstream_st*> per(64, nullptr);
  if (!per[device]) {
    per[device] = new CUstream_st();
    per[device]->device = device;
    per[device]->legacy = true;
    add_stream(per[device]);
  }
  return per[device];
}

// What the host has synchronised with: every op queued from now on is ordered after it.
Clock& host_clock() {
  static Clock c;
  return c;
}
CUstream_st* resolve(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return legacy_stream(t_device);
  return s;
}
bool is_live_stream(CUstream_st* s) {
  return std::find(streams().begin(), streams().end(), s) != streams().end();
}

bool done(CUstream_st* s, uint64_t seq) { return s->completed >= seq; }
bool ready(const Op& op) {
  for (const auto& [s, seq] : op.after)
    if (!done(s, seq)) return false;
  return true;
}

void execute(CUstream_st* s) {
  Op op = std::move(s->queue.front());
  s->queue.pop_front();
  const int saved = t_device;
  t_device = op.device;
  if (op.fn) {
    hb_begin_op(op.src, s->id, op.seq, op.clock);
    op.fn();
    hb_end_op();
  }
  t_device = saved;
  s->completed = op.seq;
  if (op.records && op.records->record_id == op.record_id) {
    op.records->completed_id = op.record_id;
    op.records->time_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
}

// Runs queued work until stream `s` has completed `seq`: only what that needs (its
// own earlier work and what it waits for), everything else stays queued.
void run_until(CUstream_st* s, uint64_t seq) {
  while (!done(s, seq)) {
    if (s->queue.empty()) fail("internal: stream has no op " + std::to_string(seq));
    const Op& head = s->queue.front();
    for (const auto& [other, need] : head.after) run_until(other, need);
    execute(s);
  }
}

// Runs every queued op of `device` (-1: all devices) in the adversarial order: of the
// stream heads that may start, the latest enqueued first.
void drain(int device) {
  for (;;) {
    CUstream_st *pick = nullptr, *blocked = nullptr;
    for (CUstream_st* s : streams()) {
      if (s->queue.empty() || (device >= 0 && s->device != device)) continue;
      if (!ready(s->queue.front())) {
        blocked = s;
        continue;
      }
      if (!pick || s->queue.front().seq > pick->queue.front().seq) pick = s;
    }
    if (pick) {
      execute(pick);
    } else if (blocked) {  // waits for another device's work
      run_until(blocked, blocked->queue.front().seq);
    } else {
      return;
    }
  }
}

void host_sync_counted() { ++counters().host_syncs; }

// The host has waited for everything ordered before `c` (a stream's newest op, an
// event's record): what it queues next is ordered after that.
void host_waited(const Clock& c) { join(host_clock(), c); }
void host_waited_device(int device) {
  for (CUstream_st* o : streams())
    if (device < 0 || o->device == device) host_waited(o->clock);
}

// What a GPU refuses while a stream captures a graph (cudaErrorStreamCaptureUnsupported:
// waits for the device, allocations): `only` a given stream, or any of the device's.
void refuse_in_capture(const char* api, const CUstream_st* only = nullptr) {
  for (CUstream_st* o : streams())
    if (o->capture && (only ? o == only : o->device == t_device))
      fail(std::string(api) + " while " + hb_stream_name(o->id) + " captures a CUDA graph: not permitted (a GPU "
           "returns cudaErrorStreamCaptureUnsupported and invalidates the capture); move it out of the captured work");
}

// Queues an op on `s`. It may start once `s`'s previous op, the legacy default
// stream's implicit dependencies and the record `waits_for` (cudaStreamWaitEvent) are
// complete; its clock is ordered after those and after what the host has waited for.
void push(CUstream_st* s, OpSource src, std::function<void()> fn, CUevent_st* records = nullptr,
          const CUevent_st* waits_for = nullptr) {
  const std::string what = std::string(src.name) + " on " + hb_stream_name(s->id);
  if (s->capture) {  // recorded into the graph, not run
    if (records || waits_for)
      fail(what + " while it captures a CUDA graph: events inside a capture (forking the capture into other "
                  "streams) are not emulated");
    s->capture->ops.push_back({src, std::move(fn)});
    return;
  }
  // The legacy stream's implicit synchronisation with a capturing blocking stream would
  // pull the capture in.
  for (CUstream_st* o : streams())
    if (o->capture && o->device == s->device && o != s && o->blocking && s->legacy)
      fail(what + " while " + hb_stream_name(o->id) + " captures a CUDA graph: the legacy default stream "
                  "synchronises with it (a GPU returns cudaErrorStreamCaptureImplicit); use the capturing stream");
  Op op;
  op.seq = ++g_seq;
  op.src = src;
  op.fn = std::move(fn);
  op.device = t_device;
  op.clock = s->clock;
  join(op.clock, host_clock());
  if (s->last_enqueued) op.after.push_back({s, s->last_enqueued});
  // The legacy default stream waits for all earlier work of the device's blocking
  // streams, and they wait for its earlier work.
  if (s->legacy) {
    for (CUstream_st* o : streams())
      if (o != s && o->device == s->device && o->blocking && o->last_enqueued) {
        op.after.push_back({o, o->last_enqueued});
        join(op.clock, o->clock);
      }
  } else if (s->blocking) {
    CUstream_st* l = legacy_stream(s->device);
    if (l->last_enqueued) op.after.push_back({l, l->last_enqueued});
    join(op.clock, l->clock);
  }
  if (waits_for && waits_for->stream) {
    op.after.push_back({waits_for->stream, waits_for->seq});
    join(op.clock, waits_for->clock);
  }
  if (op.clock.size() <= size_t(s->id)) op.clock.resize(size_t(s->id) + 1, 0);
  op.clock[size_t(s->id)] = op.seq;
  s->clock = op.clock;
  if (records) {
    op.records = records;
    op.record_id = ++records->record_id;
    records->stream = s;
    records->seq = op.seq;
    records->clock = op.clock;
  }
  s->last_enqueued = op.seq;
  s->queue.push_back(std::move(op));
}
OpSource api(const char* name, const void* caller) {
  OpSource o;
  o.name = name, o.caller = caller;
  return o;
}

// Padding that must stay zero (cuda/pool.h pool_padding), checked after every grid.
struct Padding {
  const char* p;
  size_t bytes;
};
std::vector<Padding>& paddings() {
  static std::vector<Padding> v;
  return v;
}

// The registry of kernels' opted-in dynamic shared memory.
std::map<const void*, int>& func_shared_limit() {
  static std::map<const void*, int> m;
  return m;
}

// Kernels launched so far this process, for messages.
}  // namespace

// ---- sim_api.h ---------------------------------------------------------------------

void fail(const std::string& message) {
  const std::string ctx = kernel_context();
  std::fprintf(stderr, "lns-sim: %s%s%s\n", ctx.c_str(), ctx.empty() ? "" : ": ", message.c_str());
  std::fflush(stderr);
  std::abort();
}

bool find_allocation(const void* p, size_t bytes, Allocation* out) {
  std::lock_guard<std::recursive_mutex> lock(mu());
  const auto& live = registry().live;
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = live.upper_bound(a);
  if (it == live.begin()) return false;
  --it;
  const Allocation& al = it->second;
  const uintptr_t base = reinterpret_cast<uintptr_t>(al.base);
  if (a < base || a - base > al.bytes || bytes > al.bytes - (a - base)) return false;
  if (out) *out = al;
  return true;
}

void require_device_range(const void* p, std::size_t bytes, const char* what) {
  if (!find_allocation(p, bytes, nullptr) || (bytes == 0 && !p)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%p+%zu", p, bytes);
    fail(std::string(what) + ": " + buf + " is not inside one live device allocation");
  }
}

void enqueue(cudaStream_t stream, const char* name, std::function<void()> op, const void* caller) {
  std::lock_guard<std::recursive_mutex> lock(mu());
  CUstream_st* s = resolve(stream);
  if (!is_live_stream(s)) fail(std::string(name) + ": the stream was destroyed or never created");
  push(s, api(name, caller), std::move(op));
}

void declare_access(const void* p, std::size_t bytes, bool write) { hb_access(p, bytes, write); }

bool allocation_or_gap(const void* p, Allocation* out, uintptr_t* gap_lo, uintptr_t* gap_hi) {
  std::lock_guard<std::recursive_mutex> lock(mu());
  const auto& live = registry().live;
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto next = live.upper_bound(a);
  uintptr_t lo = 0;
  if (next != live.begin()) {
    const Allocation& al = std::prev(next)->second;
    const auto base = reinterpret_cast<uintptr_t>(al.base);
    if (a - base < al.bytes) {
      *out = al;
      return true;
    }
    lo = base + al.bytes;
  }
  *gap_lo = lo;
  *gap_hi = next == live.end() ? ~uintptr_t{0} : next->first;
  return false;
}
uint64_t allocation_generation() { return registry().generation; }

int current_device() { return t_device; }

Options& options() {
  static Options o = [] {
    Options r;
    const char* v = std::getenv("LNS_SIM_CHECKS");
    const std::string s = v ? v : "";
    r.reverse_check = s.find("reverse") != std::string::npos;
    r.race_check = s.find("race") != std::string::npos;
    r.stream_check = s.find("streams") != std::string::npos;
    return r;
  }();
  return o;
}

Counters& counters() {
  static Counters c;
  return c;
}
size_t device_memory_peak(int device) { return registry().peak.at(device); }
size_t device_memory_in_use(int device) { return registry().in_use.at(device); }
void reset_device_memory_peak() {
  for (int d = 0; d < 64; ++d) registry().peak[d] = registry().in_use[d];
}

#ifndef LNS_SOURCE_ROOT
#define LNS_SOURCE_ROOT ""  // CMakeLists.txt sets it to the checkout's path
#endif
std::string source_path(const std::string& file, std::string root) {
  if (root.empty()) root = LNS_SOURCE_ROOT;
  if (!root.empty() && root.back() != '/') root += '/';
  std::string p = std::filesystem::path(file).lexically_normal().string();
  if (!root.empty() && p.compare(0, root.size(), root) == 0) return p.substr(root.size());
  if (p.empty() || p[0] != '/') {
    // Relative to the directory it was compiled in, a build folder inside the checkout
    // (ccache's base_dir writes paths so): what is left after climbing out of it.
    while (p.compare(0, 3, "../") == 0) p.erase(0, 3);
    return p;
  }
  return p.substr(p.rfind('/') + 1);
}

// ---- launches -------------------------------------------------------------------------

namespace {
// Copies and compares of whole allocations for the two-order check: they read pool
// gaps that are poisoned on purpose, so they bypass ASan (plain word loops that the
// compiler must not turn into memcpy/memcmp calls, which ASan intercepts).
#define LNS_SIM_RAW __attribute__((no_sanitize_address, optimize("no-tree-loop-distribute-patterns")))
LNS_SIM_RAW void raw_copy(char* dst, const char* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = src[i];
}
LNS_SIM_RAW size_t raw_first_difference(const char* a, const char* b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return i;
  return n;
}

std::string site_of(const LaunchSite& s) {
  return std::string("kernel ") + s.kernel + " (launched at " + source_path(s.file) + ":" + std::to_string(s.line) + ")";
}

// The device memory a grid can reach through its pointer arguments, copied.
std::vector<std::pair<Allocation, std::vector<char>>> reachable(const Grid& g) {
  std::vector<std::pair<Allocation, std::vector<char>>> out;
  std::set<char*> seen;
  for (const void* p : g.pointers) {
    Allocation a;
    if (!p || !find_allocation(p, 0, &a) || !seen.insert(a.base).second) continue;
    out.push_back({a, std::vector<char>(a.bytes)});
    raw_copy(out.back().second.data(), a.base, a.bytes);
  }
  return out;
}

LNS_SIM_RAW size_t raw_first_nonzero(const char* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i]) return i;
  return n;
}

void check_padding(const Grid& g) {
  for (const Padding& pad : paddings()) {
    const size_t i = raw_first_nonzero(pad.p, pad.bytes);
    if (i == pad.bytes) continue;
    char buf[160];
    std::snprintf(buf, sizeof buf, "byte %zu of the %zu bytes of padding at %p is 0x%02x", i, pad.bytes,
                  static_cast<const void*>(pad.p), unsigned(uint8_t(pad.p[i])));
    fail(site_of(g.site) + ": wrote into the zero padding between two tensors of a flat buffer: " + buf);
  }
}

void run_checked(const Grid& g) {
  if (!options().reverse_check) {
    run_grid(g, false);
    check_padding(g);
    return;
  }
  // The same grid in the opposite thread and block order must write the same bits:
  // otherwise the result depends on scheduling (a race, or a missing barrier).
  auto before = reachable(g);
  run_grid(g, false);
  auto forward = reachable(g);
  for (auto& [a, bytes] : before) raw_copy(a.base, bytes.data(), a.bytes);
  run_grid(g, true);
  for (auto& [a, bytes] : forward) {
    const size_t i = raw_first_difference(a.base, bytes.data(), a.bytes);
    if (i == a.bytes) continue;
    char buf[160];
    std::snprintf(buf, sizeof buf, "byte %zu of the allocation at %p (%zu bytes): 0x%02x in thread order, 0x%02x reversed",
                  i, static_cast<void*>(a.base), a.bytes, unsigned(uint8_t(bytes[i])), unsigned(uint8_t(a.base[i])));
    fail(site_of(g.site) + ": the result depends on the order threads and blocks run in (a race or a missing "
         "__syncthreads): " + buf);
  }
  check_padding(g);
}
}  // namespace

void check_pointer_arg(const LaunchSite& site, int index, const void* p) {
  if (!p || find_allocation(p, 0, nullptr)) return;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%p", p);
  fail(site_of(site) + ": pointer argument " + std::to_string(index) + " (" + buf +
       ") is not in a live device allocation (a host pointer, or freed memory)");
}

void launch_grid(const LaunchSite& site, const void* func, dim3 grid, dim3 block, size_t shared_bytes,
                 cudaStream_t stream, std::function<void()> thread_body, std::vector<const void*> pointers) {
  std::lock_guard<std::recursive_mutex> lock(mu());
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  auto bad = [&](const std::string& why) { fail(site_of(site) + ": invalid launch configuration: " + why); };
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0)
    bad("an empty grid (" + std::to_string(grid.x) + "," + std::to_string(grid.y) + "," + std::to_string(grid.z) +
        ") x block (" + std::to_string(block.x) + "," + std::to_string(block.y) + "," + std::to_string(block.z) + ")");
  if (threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64)
    bad("block (" + std::to_string(block.x) + "," + std::to_string(block.y) + "," + std::to_string(block.z) +
        ") has " + std::to_string(threads) + " threads; the limit is 1024 (z <= 64)");
  if (grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
    bad("grid (" + std::to_string(grid.x) + "," + std::to_string(grid.y) + "," + std::to_string(grid.z) +
        ") exceeds (2^31-1, 65535, 65535)");
  if (shared_bytes > kSharedDefault) {
    const auto it = func_shared_limit().find(func);
    const size_t limit = it == func_shared_limit().end() ? kSharedDefault : size_t(it->second);
    if (shared_bytes > limit)
      bad(std::to_string(shared_bytes) + " bytes of dynamic shared memory; " +
          (it == func_shared_limit().end() ? "above 48 KiB needs cudaFuncSetAttribute(MaxDynamicSharedMemorySize)"
                                           : "the kernel opted in to " + std::to_string(limit)));
  }
  CUstream_st* s = resolve(stream);
  if (!is_live_stream(s)) fail(site_of(site) + ": the stream was destroyed or never created");
  ++counters().launches;
  auto g = std::make_shared<Grid>();
  g->site = site, g->grid = grid, g->block = block, g->shared_bytes = shared_bytes;
  g->body = std::move(thread_body);
  g->pointers = std::move(pointers);
  g->static_shared = kernel_static_shared(func);
  OpSource src;
  src.name = site.kernel, src.file = site.file, src.line = site.line;
  push(s, src, [g] {
    ++counters().kernels_run;
    run_checked(*g);
  });
}

}  // namespace lns::sim

// ---- pools (cuda/pool.h) -------------------------------------------------------------

namespace lns::cuda {
void pool_gap(const void* p, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  lns::sim::require_device_range(p, bytes, "pool gap");
  lns::sim::enqueue(stream, "pool gap", [p, bytes] {
#if defined(__SANITIZE_ADDRESS__)
    ASAN_POISON_MEMORY_REGION(p, bytes);
#else
    std::memset(const_cast<void*>(p), 0xff, bytes);  // NaN: a read of the gap shows
#endif
  });
}
void pool_padding(const void* p, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  lns::sim::require_device_range(p, bytes, "flat-buffer padding");
  lns::sim::enqueue(stream, "padding", [p, bytes] {
    const char* c = static_cast<const char*>(p);
    for (size_t i = 0; i < bytes; ++i)
      if (c[i]) lns::sim::fail("flat-buffer padding registered while not zero");
    lns::sim::paddings().push_back({c, bytes});
  });
}
void pool_use(const void* p, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  lns::sim::require_device_range(p, bytes, "pool use");
  lns::sim::enqueue(stream, "pool use", [p, bytes] {
#if defined(__SANITIZE_ADDRESS__)
    ASAN_UNPOISON_MEMORY_REGION(p, bytes);
#endif
    (void)p, (void)bytes;
  });
}
}  // namespace lns::cuda

// ---- the CUDA runtime API ------------------------------------------------------------

using lns::sim::declare_access;
using lns::sim::fail;
using lns::sim::mu;
using lns::sim::registry;
using lns::sim::set_error;
using lns::sim::t_device;
using Lock = std::lock_guard<std::recursive_mutex>;

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
  }
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (emulator: LNS_SIM_DEVICES=0)";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
  }
  return "unknown error";
}
cudaError_t cudaGetLastError() {
  const cudaError_t e = lns::sim::t_last_error;
  lns::sim::t_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return lns::sim::t_last_error; }

cudaError_t cudaGetDeviceCount(int* count) {
  *count = lns::sim::device_count();
  return *count == 0 ? set_error(cudaErrorNoDevice) : cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= lns::sim::device_count()) return set_error(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  if (lns::sim::device_count() == 0) return set_error(cudaErrorNoDevice);
  *device = t_device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (device < 0 || device >= lns::sim::device_count()) return set_error(cudaErrorInvalidDevice);
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "NVIDIA H100 80GB HBM3 (emulated by lns-sim)");
  p->totalGlobalMem = lns::sim::kTotalMemory;
  p->sharedMemPerBlock = lns::sim::kSharedDefault;
  p->sharedMemPerBlockOptin = lns::sim::kSharedOptin;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 0x7fffffff, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
  p->clockRate = 1980000;
  p->major = 9, p->minor = 0;
  p->multiProcessorCount = lns::sim::kSms;
  p->memoryClockRate = 2619000;
  p->memoryBusWidth = 5120;
  p->l2CacheSize = 50 << 20;
  p->maxThreadsPerMultiProcessor = 2048;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return set_error(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = int(p.sharedMemPerBlock); break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = int(p.sharedMemPerBlockOptin); break;
    default: return set_error(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = 13000;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = 13000;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  Lock lock(mu());
  lns::sim::refuse_in_capture("cudaDeviceSynchronize");
  lns::sim::host_sync_counted();
  lns::sim::drain(t_device);
  lns::sim::host_waited_device(t_device);
  return cudaSuccess;
}
cudaError_t cudaDeviceReset() { return cudaDeviceSynchronize(); }

// Each allocation is its own host allocation of exactly `bytes` (256-byte aligned like
// cudaMalloc's), so AddressSanitizer reports an access one byte past it. Its content
// starts as NaN bytes: device memory is not zeroed.
cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  Lock lock(mu());
  lns::sim::refuse_in_capture("cudaMalloc");
  auto& r = registry();
  if (bytes == 0) {
    *ptr = nullptr;
    return cudaSuccess;
  }
  if (r.in_use[t_device] + bytes > lns::sim::kTotalMemory) {
    *ptr = nullptr;
    return set_error(cudaErrorMemoryAllocation);
  }
  void* p = nullptr;
  if (posix_memalign(&p, 256, bytes) != 0) return set_error(cudaErrorMemoryAllocation);
  std::memset(p, 0xff, bytes);
  r.live[reinterpret_cast<uintptr_t>(p)] = lns::sim::Allocation{static_cast<char*>(p), bytes, t_device};
  ++r.generation;
  r.in_use[t_device] += bytes;
  r.peak[t_device] = std::max(r.peak[t_device], r.in_use[t_device]);
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  Lock lock(mu());
  if (!ptr) return cudaSuccess;
  lns::sim::refuse_in_capture("cudaFree");
  // cudaFree synchronises the device: queued work may still use the memory.
  lns::sim::host_sync_counted();
  lns::sim::drain(-1);
  lns::sim::host_waited_device(-1);
  auto& r = registry();
  const auto it = r.live.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == r.live.end()) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%p", ptr);
    fail(std::string("cudaFree(") + buf + "): not the start of a live device allocation");
  }
  r.in_use[it->second.device] -= it->second.bytes;
  auto& pads = lns::sim::paddings();
  const char* base = it->second.base;
  const size_t size = it->second.bytes;
  pads.erase(std::remove_if(pads.begin(), pads.end(),
                            [&](const lns::sim::Padding& p) { return p.p >= base && p.p < base + size; }),
             pads.end());
  r.live.erase(it);
  ++r.generation;
  lns::sim::hb_forget(ptr);
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  *ptr = std::malloc(bytes);
  return *ptr ? cudaSuccess : set_error(cudaErrorMemoryAllocation);
}
cudaError_t cudaFreeHost(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  Lock lock(mu());
  *total_bytes = lns::sim::kTotalMemory;
  *free_bytes = lns::sim::kTotalMemory - registry().in_use[t_device];
  return cudaSuccess;
}

namespace {
bool on_device(const void* p) { return p && lns::sim::find_allocation(p, 0, nullptr); }

// Queues a copy. Host memory is pageable here (no pinned memory is used), so, as CUDA
// documents: the source of a host-to-device copy is staged before the call returns,
// and a copy to the host returns only once it has completed.
cudaError_t copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream, bool sync,
                 const char* api, const void* caller) {
  Lock lock(mu());
  if (bytes == 0) return cudaSuccess;
  if (kind == cudaMemcpyDefault)
    kind = on_device(dst) ? (on_device(src) ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                          : (on_device(src) ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  const std::string what = std::string(api);
  if (dst_dev) lns::sim::require_device_range(dst, bytes, (what + " destination").c_str());
  if (src_dev) lns::sim::require_device_range(src, bytes, (what + " source").c_str());
  if (!dst_dev && on_device(dst)) fail(what + ": the destination is device memory but the kind says host");
  if (!src_dev && on_device(src)) fail(what + ": the source is device memory but the kind says host");
  CUstream_st* s = lns::sim::resolve(stream);
  if (s->capture && !(src_dev && dst_dev))
    fail(what + " between host and device memory while " + lns::sim::hb_stream_name(s->id) +
         " captures a CUDA graph: a pageable host copy cannot be captured (the graph would replay the bytes the "
         "host had at capture time); copy outside the captured work");
  const lns::sim::OpSource from = lns::sim::api(api, caller);
  if (!src_dev) {  // pageable host source: staged now
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + bytes);
    if (sync) {  // cudaMemcpy: a stream sync first (the copy itself may still be in flight on return)
      lns::sim::run_until(s, s->last_enqueued);
      lns::sim::host_waited(s->clock);
    }
    lns::sim::push(s, from, [dst, staged, dst_dev] {
      if (dst_dev) declare_access(dst, staged->size(), true);
      std::memcpy(dst, staged->data(), staged->size());
    });
    return cudaSuccess;
  }
  lns::sim::push(s, from, [dst, src, bytes, dst_dev] {
    declare_access(src, bytes, false);
    if (dst_dev) declare_access(dst, bytes, true);
    std::memmove(dst, src, bytes);
  });
  if (sync || !dst_dev) {  // to pageable host memory, or cudaMemcpy: returns when done
    lns::sim::host_sync_counted();
    lns::sim::run_until(s, s->last_enqueued);
    lns::sim::host_waited(s->clock);
  }
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return copy(dst, src, bytes, kind, nullptr, true, "cudaMemcpy", __builtin_return_address(0));
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  return copy(dst, src, bytes, kind, stream, false, "cudaMemcpyAsync", __builtin_return_address(0));
}
namespace {
cudaError_t memset_on(void* ptr, int value, size_t bytes, cudaStream_t stream, const char* api, const void* caller) {
  Lock lock(mu());
  if (bytes == 0) return cudaSuccess;
  lns::sim::require_device_range(ptr, bytes, "cudaMemset");
  lns::sim::push(lns::sim::resolve(stream), lns::sim::api(api, caller), [ptr, value, bytes] {
    declare_access(ptr, bytes, true);
    std::memset(ptr, value, bytes);
  });
  return cudaSuccess;
}
}  // namespace
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  return memset_on(ptr, value, bytes, stream, "cudaMemsetAsync", __builtin_return_address(0));
}
// Asynchronous with respect to the host for device memory (CUDA's API sync rules).
cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  return memset_on(ptr, value, bytes, nullptr, "cudaMemset", __builtin_return_address(0));
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  Lock lock(mu());
  auto* s = new CUstream_st();
  s->device = t_device;
  s->blocking = !(flags & cudaStreamNonBlocking);
  lns::sim::add_stream(s);
  *stream = s;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Lock lock(mu());
  CUstream_st* s = stream;
  if (!lns::sim::is_live_stream(s) || s->legacy) return set_error(cudaErrorInvalidResourceHandle);
  lns::sim::refuse_in_capture("cudaStreamDestroy", s);
  // Queued work still completes (CUDA's rule); the handle is gone at once.
  lns::sim::run_until(s, s->last_enqueued);
  auto& all = lns::sim::streams();
  all.erase(std::find(all.begin(), all.end(), s));
  // kept allocated: events and other streams' dependencies may still name it
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Lock lock(mu());
  CUstream_st* s = lns::sim::resolve(stream);
  if (!lns::sim::is_live_stream(s)) fail("cudaStreamSynchronize: the stream was destroyed or never created");
  lns::sim::refuse_in_capture("cudaStreamSynchronize", s);
  lns::sim::host_sync_counted();
  lns::sim::run_until(s, s->last_enqueued);
  lns::sim::host_waited(s->clock);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {  // lns::sim::BusyAnswers
  Lock lock(mu());
  CUstream_st* s = lns::sim::resolve(stream);
  lns::sim::refuse_in_capture("cudaStreamQuery", s);
  // Done: the host has seen the stream's work complete (a synchronisation).
  if (s->completed >= s->last_enqueued) return lns::sim::host_waited(s->clock), cudaSuccess;
  if (s->busy.busy(s->last_enqueued)) return cudaErrorNotReady;
  lns::sim::host_sync_counted();
  lns::sim::run_until(s, s->last_enqueued);
  lns::sim::host_waited(s->clock);
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  Lock lock(mu());
  CUstream_st* s = lns::sim::resolve(stream);
  if (!event) return set_error(cudaErrorInvalidResourceHandle);
  if (!event->stream) return cudaSuccess;  // never recorded: nothing to wait for
  lns::sim::push(s, lns::sim::api("cudaStreamWaitEvent", nullptr), nullptr, nullptr, event);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) {
  *event = new CUevent_st();
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  // Kept allocated: a queued record may still complete it.
  (void)event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Lock lock(mu());
  if (!event) return set_error(cudaErrorInvalidResourceHandle);
  lns::sim::push(lns::sim::resolve(stream), lns::sim::api("cudaEventRecord", nullptr), nullptr, event);
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  Lock lock(mu());
  if (!event) return set_error(cudaErrorInvalidResourceHandle);
  lns::sim::host_sync_counted();
  if (event->stream) lns::sim::run_until(event->stream, event->seq);
  lns::sim::host_waited(event->clock);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {  // lns::sim::BusyAnswers
  Lock lock(mu());
  if (!event) return set_error(cudaErrorInvalidResourceHandle);
  if (!event->stream || event->completed_id == event->record_id) return lns::sim::host_waited(event->clock), cudaSuccess;
  if (event->busy.busy(event->record_id)) return cudaErrorNotReady;
  lns::sim::host_sync_counted();
  lns::sim::run_until(event->stream, event->seq);
  lns::sim::host_waited(event->clock);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  // The host time between the two records' execution: not a GPU time (docs/cuda.md).
  *ms = static_cast<float>(end->time_ms - start->time_ms);
  return cudaSuccess;
}

cudaError_t lns_sim_func_set_attribute(const void* func, cudaFuncAttribute attr, int value) {
  Lock lock(mu());
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return set_error(cudaErrorInvalidValue);
  if (value < 0 || size_t(value) > lns::sim::kSharedOptin) return set_error(cudaErrorInvalidValue);
  lns::sim::func_shared_limit()[func] = value;
  return cudaSuccess;
}

// ---- CUDA graphs ------------------------------------------------------------------------
// Capture records what a stream is given (kernels, copies, memsets, the stand-ins'
// work) instead of queueing it; a launch queues the recorded ops on the launch stream,
// in their order, as ops like any other (so every check, the cross-stream one
// included, sees each replay). What a GPU refuses during a capture is reported
// (refuse_in_capture, push, copy).

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  Lock lock(mu());
  CUstream_st* s = lns::sim::resolve(stream);
  if (s->legacy) fail("cudaStreamBeginCapture: the legacy default stream cannot capture; use a created stream");
  if (s->capture) fail("cudaStreamBeginCapture: " + lns::sim::hb_stream_name(s->id) + " is already capturing");
  s->capture = new CUgraph_st();
  s->capture->device = s->device;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  Lock lock(mu());
  CUstream_st* s = lns::sim::resolve(stream);
  if (!s->capture) fail("cudaStreamEndCapture: " + lns::sim::hb_stream_name(s->id) + " is not capturing");
  *graph = s->capture;
  s->capture = nullptr;
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  Lock lock(mu());
  *status = lns::sim::resolve(stream)->capture ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  Lock lock(mu());
  if (!graph) return set_error(cudaErrorInvalidResourceHandle);
  *exec = new CUgraphExec_st{graph->device, graph->ops};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  Lock lock(mu());
  if (!exec) return set_error(cudaErrorInvalidResourceHandle);
  CUstream_st* s = lns::sim::resolve(stream);
  if (!lns::sim::is_live_stream(s)) fail("cudaGraphLaunch: the stream was destroyed or never created");
  if (s->device != exec->device) fail("cudaGraphLaunch: a graph of device " + std::to_string(exec->device) +
                                      " launched on a stream of device " + std::to_string(s->device));
  if (s->capture) fail("cudaGraphLaunch into a capturing stream (a child graph) is not emulated");
  ++lns::sim::counters().graph_launches;
  for (const CapturedOp& op : exec->ops) {
    lns::sim::OpSource src = op.src;
    src.replayed = true;
    lns::sim::push(s, src, op.fn);
  }
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;  // queued replays hold copies of its ops
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
