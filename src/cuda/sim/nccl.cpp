// The NCCL stand-in of the emulation build (include/nccl.h), over MPI. Each rank is
// one process with one emulated device; a communicator is an MPI communicator of its
// members, built by a rendezvous at the world rank that created the unique id (NCCL's
// bootstrap root). A collective is checked when it is called (buffers, aliasing,
// device) and queued with lns::sim::enqueue; when its stream reaches it, the ranks
// first agree that they run the same call (number, kind, count, type, op, root) and
// then move the data with MPI. Reductions go to rank 0 and back, so every rank gets
// the same bits (as NCCL's ring gives); their association order is MPI's, not NCCL's.
//
// Faults, for the watchdog's tests (docs/resilience.md): LNS_SIM_NCCL_FAULT=KIND@N:rank=R
// makes the N-th collective this process runs (1-based, over all its communicators) on
// world rank R never finish, as a wedged GPU or link would: `hang` just waits; `fail`
// also reports ncclRemoteError from ncclCommGetAsyncError, as NCCL does when a peer or
// the network fails. ncclCommAbort (which the watchdog calls from its own thread)
// frees such a collective and any collective waiting for other ranks, as it frees a
// stuck kernel: it returns without moving data, and the communicator is unusable.
//
// The ordering rule: NCCL documents concurrent work on several communicators as
// unsafe (it can hang), so at most one communicator of a device may have work in
// flight. A collective that runs while a collective of another communicator, issued
// before it, has not run yet is reported: nothing ordered the two (the emulator runs
// the newest ready work first, so an unordered pair always shows up this way).
#include <mpi.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#ifdef LNS_CUDA_SIM  // the emulator's runtime (the stand-in's own tests may run without it)
#include <cuda_runtime.h>
#endif

#include "absl/strings/str_cat.h"
#include "cuda/sim/sim_api.h"
#include "lns/core/bf16.h"

namespace {

using lns::sim::fail;

constexpr char kMagic[8] = {'L', 'N', 'S', 'S', 'I', 'M', 'N', 'C'};
// Bootstrap messages on MPI_COMM_WORLD: hellos to the root on kTagBase + seq, its
// replies on kTagBase + kTagRange + seq, so that a root never takes a reply for a hello.
constexpr int kTagBase = 23000, kTagRange = 4096;

// What ncclUniqueId holds under emulation.
struct IdBody {
  char magic[8];
  int32_t creator;  // world rank of the bootstrap root
  uint32_t seq;     // ids created by that rank so far: keeps rendezvous messages apart
  uint64_t nonce;
};
static_assert(sizeof(IdBody) <= NCCL_UNIQUE_ID_BYTES);

// A member introducing itself to the bootstrap root.
struct Hello {
  int32_t rank, nranks, world_rank, device;
  uint64_t nonce;
  char host[MPI_MAX_PROCESSOR_NAME];
};

void mpi_ok(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail(std::string("emulated NCCL: ") + what + " failed: " + std::string(msg, len));
}

void need_mpi(const char* call) {
  int init = 0, fin = 0;
  MPI_Initialized(&init), MPI_Finalized(&fin);
  if (!init || fin) fail(std::string(call) + ": the emulated NCCL runs over MPI, which is not initialised");
}

struct State;
// Every live communicator of this process, for the ordering rule.
std::mutex g_states_mu;
std::set<State*> g_states;

struct State {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1, device = 0;
  std::atomic<bool> aborted{false};               // ncclCommAbort, from any thread
  std::atomic<int> async_error{int(ncclSuccess)};  // what ncclCommGetAsyncError reports
  uint64_t issued = 0, executed = 0;  // collectives queued / run, in call order
  // Process-wide issue numbers of the collectives queued and not yet run (oldest first).
  std::deque<uint64_t> in_flight;
#ifdef LNS_CUDA_SIM
  cudaEvent_t last = nullptr;  // recorded behind the latest collective queued
#endif
  State() {
    std::lock_guard<std::mutex> lock(g_states_mu);
    g_states.insert(this);
  }
  ~State() {
    {
      std::lock_guard<std::mutex> lock(g_states_mu);
      g_states.erase(this);
    }
#ifdef LNS_CUDA_SIM
    if (last) cudaEventDestroy(last);
#endif
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
};

// bf16 reductions, rounded after every combination as a ring reduction does.
template <int Op>
void bf16_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = lns::bf16_to_f32(a[i]), y = lns::bf16_to_f32(b[i]);
    const float r = Op == ncclSum ? x + y : Op == ncclProd ? x * y : Op == ncclMax ? (x > y ? x : y) : (x < y ? x : y);
    b[i] = lns::f32_to_bf16(r);
  }
}

MPI_Op bf16_op(ncclRedOp_t op) {
  static MPI_Op ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  static MPI_User_function* const fns[4] = {bf16_reduce<ncclSum>, bf16_reduce<ncclProd>, bf16_reduce<ncclMax>,
                                            bf16_reduce<ncclMin>};
  if (ops[op] == MPI_OP_NULL) mpi_ok(MPI_Op_create(fns[op], 1, &ops[op]), "MPI_Op_create");
  return ops[op];
}

struct Type {
  MPI_Datatype mpi;
  size_t size;
};

Type type_of(ncclDataType_t t, const char* call) {
  switch (t) {
    case ncclInt8: return {MPI_INT8_T, 1};
    case ncclUint8: return {MPI_UINT8_T, 1};
    case ncclInt32: return {MPI_INT32_T, 4};
    case ncclUint32: return {MPI_UINT32_T, 4};
    case ncclInt64: return {MPI_INT64_T, 8};
    case ncclUint64: return {MPI_UINT64_T, 8};
    case ncclFloat32: return {MPI_FLOAT, 4};
    case ncclFloat64: return {MPI_DOUBLE, 8};
    case ncclBfloat16: return {MPI_UINT16_T, 2};
    default: break;
  }
  fail(std::string(call) + ": datatype " + std::to_string(int(t)) + " is not modelled by the emulation");
}

MPI_Op op_of(ncclRedOp_t op, ncclDataType_t t, const char* call) {
  if (op < ncclSum || op > ncclMin)
    fail(std::string(call) + ": reduction op " + std::to_string(int(op)) + " is not modelled by the emulation");
  if (t == ncclBfloat16) return bf16_op(op);
  const MPI_Op ops[4] = {MPI_SUM, MPI_PROD, MPI_MAX, MPI_MIN};
  return ops[op];
}

enum Kind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kReduce };
const char* const kNames[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclBroadcast", "ncclReduce"};
bool reduces(Kind k) { return k == kAllReduce || k == kReduceScatter || k == kReduce; }
bool has_root(Kind k) { return k == kBroadcast || k == kReduce; }

// One queued collective. count: elements of recvbuff (all-reduce, reduce-scatter,
// broadcast, reduce) or of sendbuff (all-gather), as NCCL counts them.
struct Coll {
  Kind kind;
  const void* send;
  void* recv;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;
  uint64_t seq;
  uint64_t issue;  // process-wide issue number (all communicators)
};

bool overlap(const void* p, size_t pb, const void* q, size_t qb) {
  const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(q);
  return pb && qb && a < b + qb && b < a + pb;
}

int wait_limit_s() {
  static const int s = [] {
    const char* v = std::getenv("LNS_SIM_NCCL_WAIT_S");
    const int n = v ? std::atoi(v) : 0;
    return n > 0 ? n : 120;
  }();
  return s;
}

// LNS_SIM_NCCL_FAULT (top of the file): {kind ('h'ang or 'f'ail or 0), N} for this rank.
std::pair<char, uint64_t> injected_fault() {
  static const std::pair<char, uint64_t> f = [] {
    const char* v = std::getenv("LNS_SIM_NCCL_FAULT");
    if (!v || !*v) return std::pair<char, uint64_t>{0, 0};
    const std::string spec(v);
    unsigned long long n = 0;
    int rank = -1, world = 0;
    char kind[8] = {};
    if (std::sscanf(spec.c_str(), "%7[a-z]@%llu:rank=%d", kind, &n, &rank) != 3 || n == 0 ||
        (std::string(kind) != "hang" && std::string(kind) != "fail"))
      fail("LNS_SIM_NCCL_FAULT='" + spec + "': expected hang@N:rank=R or fail@N:rank=R");
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    return world == rank ? std::pair<char, uint64_t>{kind[0], n} : std::pair<char, uint64_t>{0, 0};
  }();
  return f;
}

// The ranks must be running the same call: NCCL hangs or mixes data otherwise. False
// when the communicator was aborted while waiting for the others.
bool agree(const State& s, const Coll& c) {
  const int64_t mine[6] = {int64_t(c.seq), c.kind, int64_t(c.count), c.type, reduces(c.kind) ? c.op : -1,
                           has_root(c.kind) ? c.root : -1};
  std::vector<int64_t> all(6 * s.size);
  // A rank that never arrives would hang the run (e.g. collectives of two
  // communicators run in different orders on different ranks): wait with a deadline.
  MPI_Request req;
  mpi_ok(MPI_Iallgather(mine, 6, MPI_INT64_T, all.data(), 6, MPI_INT64_T, s.comm, &req), "MPI_Iallgather");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(wait_limit_s());
  for (int done = 0; !done;) {
    mpi_ok(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) break;
    if (s.aborted) return false;  // the request is left behind: the process is ending
    if (std::chrono::steady_clock::now() > deadline)
      fail(std::string(kNames[c.kind]) + ": collective #" + std::to_string(c.seq) + " waited " +
           std::to_string(wait_limit_s()) + " s for the other ranks of its communicator (a rank that never " +
           "issues it, or collectives of several communicators run in different orders on different ranks; " +
           "LNS_SIM_NCCL_WAIT_S sets the limit)");
    std::this_thread::sleep_for(std::chrono::microseconds(50));  // other ranks may share the core
  }
  bool same = true;
  for (int r = 1; r < s.size; ++r) same = same && std::memcmp(&all[0], &all[6 * r], sizeof mine) == 0;
  if (same) return true;
  std::string m = std::string(kNames[c.kind]) + ": ranks disagree on the collective they run (call#, kind, count, " +
                  "datatype, op, root):";
  for (int r = 0; r < s.size; ++r) {
    const int64_t* v = &all[6 * r];
    absl::StrAppend(&m, " rank ", r, " {", v[0], " ", kNames[v[1]], " ", v[2], " ", v[3], " ", v[4], " ", v[5], "}");
  }
  fail(m);
}

// Runs when the stream reaches the collective.
void execute(State& s, const Coll& c) {
  const char* name = kNames[c.kind];
  static uint64_t run = 0;  // collectives run by this process (the stream's thread)
  ++run;
  if (s.aborted) return;  // an aborted communicator's queued work returns at once
  if (const auto [kind, n] = injected_fault(); kind && run == n) {
    if (kind == 'f') s.async_error = int(ncclRemoteError);
    std::fprintf(stderr, "emulated NCCL: LNS_SIM_NCCL_FAULT: collective %llu (%s) on this rank never finishes\n",
                 static_cast<unsigned long long>(run), name);
    while (!s.aborted) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return;
  }
  if (c.seq != s.executed)
    fail(std::string(name) + ": collective #" + std::to_string(c.seq) + " of this communicator runs before #" +
         std::to_string(s.executed) + " (internal: submit() orders them as NCCL does)");
  ++s.executed;
  {
    // The ordering rule (top of the file): an older collective of another
    // communicator of this device that has not run is still in flight beside this one.
    std::lock_guard<std::mutex> lock(g_states_mu);
    for (const State* o : g_states)
      if (o != &s && o->device == s.device && !o->in_flight.empty() && o->in_flight.front() < c.issue)
        fail(std::string(name) + ": collective #" + std::to_string(c.seq) + " of one communicator runs while " +
             "collective #" + std::to_string(o->executed) + " of another communicator (of " +
             std::to_string(o->size) + " ranks), issued before it, is still in flight: nothing orders the two " +
             "(NCCL: work on several communicators at once may hang; order them by stream or event)");
    s.in_flight.pop_front();
  }
  if (s.size > 1 && !agree(s, c)) return;
  const Type t = type_of(c.type, name);
  const int n = int(c.count);
  const size_t bytes = c.count * t.size;
  std::vector<char> buf;
  switch (c.kind) {
    case kAllReduce: {  // reduce to rank 0 and broadcast: the same bits everywhere
      buf.assign(static_cast<const char*>(c.send), static_cast<const char*>(c.send) + bytes);
      const MPI_Op op = op_of(c.op, c.type, name);
      mpi_ok(MPI_Reduce(s.rank == 0 ? MPI_IN_PLACE : buf.data(), buf.data(), n, t.mpi, op, 0, s.comm), "MPI_Reduce");
      mpi_ok(MPI_Bcast(buf.data(), n, t.mpi, 0, s.comm), "MPI_Bcast");
      break;
    }
    case kReduceScatter: {
      const std::vector<char> in(static_cast<const char*>(c.send), static_cast<const char*>(c.send) + bytes * s.size);
      buf.resize(bytes);
      mpi_ok(MPI_Reduce_scatter_block(in.data(), buf.data(), n, t.mpi, op_of(c.op, c.type, name), s.comm),
             "MPI_Reduce_scatter_block");
      break;
    }
    case kAllGather: {
      const std::vector<char> in(static_cast<const char*>(c.send), static_cast<const char*>(c.send) + bytes);
      buf.resize(bytes * s.size);
      mpi_ok(MPI_Allgather(in.data(), n, t.mpi, buf.data(), n, t.mpi, s.comm), "MPI_Allgather");
      break;
    }
    case kReduce: {  // recvbuff is written on the root only, as NCCL does
      buf.assign(static_cast<const char*>(c.send), static_cast<const char*>(c.send) + bytes);
      const MPI_Op op = op_of(c.op, c.type, name);
      mpi_ok(MPI_Reduce(s.rank == c.root ? MPI_IN_PLACE : buf.data(), buf.data(), n, t.mpi, op, c.root, s.comm),
             "MPI_Reduce");
      if (s.rank != c.root) buf.clear();
      break;
    }
    case kBroadcast:
      buf.resize(bytes);
      if (s.rank == c.root) std::memcpy(buf.data(), c.send, bytes);
      mpi_ok(MPI_Bcast(buf.data(), n, t.mpi, c.root, s.comm), "MPI_Bcast");
      break;
  }
  if (!buf.empty()) std::memcpy(c.recv, buf.data(), buf.size());
}

}  // namespace

struct ncclComm {
  std::shared_ptr<State> state;  // queued collectives hold it too
  bool destroyed = false;        // the handle stays allocated so that a use after destroy is caught
};

namespace {

// Call-time checks shared by the collectives, then the queueing.
ncclResult_t submit(Kind kind, const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                    int root, ncclComm_t comm, cudaStream_t stream, const void* caller) {
  const std::string name = kNames[kind];
  if (!comm) fail(name + ": null communicator");
  if (comm->destroyed) fail(name + ": communicator used after ncclCommDestroy");
  State& s = *comm->state;
  if (s.aborted) fail(name + ": communicator used after ncclCommAbort");
  if (lns::sim::current_device() != s.device)
    fail(name + ": communicator of device " + std::to_string(s.device) + " used while device " +
         std::to_string(lns::sim::current_device()) + " is current (the stream belongs to another device)");
  const Type t = type_of(type, name.c_str());
  if (reduces(kind)) op_of(op, type, name.c_str());
  if (has_root(kind) && (root < 0 || root >= s.size))
    fail(name + ": root " + std::to_string(root) + " outside a communicator of " + std::to_string(s.size) + " ranks");
  if (count > size_t(INT_MAX)) fail(name + ": count " + std::to_string(count) + " is not modelled (> INT_MAX)");
  const size_t bytes = count * t.size;
  const size_t send_bytes = kind == kReduceScatter ? bytes * s.size : bytes;
  const size_t recv_bytes = kind == kAllGather ? bytes * s.size : kind == kReduce && s.rank != root ? 0 : bytes;
  const bool reads_send = kind != kBroadcast || s.rank == root;
  if (reads_send && send_bytes) lns::sim::require_device_range(send, send_bytes, (name + " sendbuff").c_str());
  if (recv_bytes) lns::sim::require_device_range(recv, recv_bytes, (name + " recvbuff").c_str());
  // NCCL's in-place forms; any other overlap of the two buffers is undefined.
  const char* in_place = static_cast<const char*>(send);
  if (kind == kReduceScatter) in_place = static_cast<const char*>(send) + s.rank * bytes;
  const bool is_in_place = kind == kAllGather ? static_cast<const char*>(recv) + s.rank * bytes == send
                                              : in_place == static_cast<const char*>(recv);
  if (reads_send && !is_in_place && overlap(send, send_bytes, recv, recv_bytes))
    fail(name + ": sendbuff and recvbuff overlap without being NCCL's in-place form");
  auto state = comm->state;
  static uint64_t issue = 0;  // the host thread that queues collectives; under g_states_mu
  uint64_t mine;
  {
    std::lock_guard<std::mutex> lock(g_states_mu);
    mine = issue++;
    s.in_flight.push_back(mine);
  }
  const Coll c{kind, send, recv, count, type, op, root, s.issued++, mine};
#ifdef LNS_CUDA_SIM
  // NCCL runs a communicator's collectives one after the other whatever streams they
  // were queued on (its kernel waits for the communicator's previous one): the same
  // dependency here, so that the emulator's adversarial order cannot swap them.
  auto cuda_ok = [&name](cudaError_t e) {
    if (e != cudaSuccess) fail(name + ": ordering behind the previous collective: " + cudaGetErrorString(e));
  };
  if (!s.last)
    cuda_ok(cudaEventCreateWithFlags(&s.last, cudaEventDisableTiming));
  else
    cuda_ok(cudaStreamWaitEvent(stream, s.last, 0));
#endif
  const size_t reads = reads_send ? send_bytes : 0;
  lns::sim::enqueue(
      stream, kNames[kind],
      [state, c, reads, recv_bytes] {
        lns::sim::declare_access(c.send, reads, false), lns::sim::declare_access(c.recv, recv_bytes, true);
        execute(*state, c);
      },
      caller);
#ifdef LNS_CUDA_SIM
  cuda_ok(cudaEventRecord(s.last, stream));
#endif
  return ncclSuccess;
}

int g_group_depth = 0;

}  // namespace

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  need_mpi("ncclGetUniqueId");
  if (!id) return ncclInvalidArgument;
  static std::atomic<uint32_t> seq{0};
  IdBody b{};
  std::memcpy(b.magic, kMagic, sizeof kMagic);
  MPI_Comm_rank(MPI_COMM_WORLD, &b.creator);
  b.seq = seq++;
  b.nonce = (uint64_t(std::random_device{}()) << 32) ^ uint64_t(getpid()) ^ (uint64_t(b.seq) << 48);
  std::memset(id, 0, sizeof *id);
  std::memcpy(id->internal, &b, sizeof b);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  const std::string call = "ncclCommInitRank";
  need_mpi(call.c_str());
  if (!comm) return ncclInvalidArgument;
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  IdBody id;
  std::memcpy(&id, commId.internal, sizeof id);
  if (std::memcmp(id.magic, kMagic, sizeof kMagic) != 0) fail(call + ": the unique id was not made by ncclGetUniqueId");
  int world = 0, world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world), MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (id.creator < 0 || id.creator >= world_size) fail(call + ": corrupt unique id");
  const int tag = kTagBase + int(id.seq % kTagRange), reply_tag = tag + kTagRange;
  Hello me{};
  me.rank = rank, me.nranks = nranks, me.world_rank = world, me.device = lns::sim::current_device();
  me.nonce = id.nonce;
  int len = 0;
  MPI_Get_processor_name(me.host, &len);

  std::vector<int> reply(1 + nranks);  // status, then the world rank of each member
  if (world == id.creator) {
    std::vector<Hello> all(nranks);
    std::vector<bool> seen(nranks, false);
    all[rank] = me, seen[rank] = true;
    for (int i = 1; i < nranks; ++i) {
      Hello h;
      mpi_ok(MPI_Recv(&h, sizeof h, MPI_BYTE, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
      if (h.nonce != id.nonce) fail(call + ": two unique ids of rank " + std::to_string(world) + " in flight at once");
      if (h.nranks != nranks)
        fail(call + ": world rank " + std::to_string(h.world_rank) + " says nranks = " + std::to_string(h.nranks) +
             ", the root " + std::to_string(nranks));
      if (h.rank < 0 || h.rank >= nranks || seen[h.rank])
        fail(call + ": rank " + std::to_string(h.rank) + " joined twice or is out of range");
      all[h.rank] = h, seen[h.rank] = true;
    }
    reply[0] = ncclSuccess;
    for (int i = 0; i < nranks; ++i) {
      reply[1 + i] = all[i].world_rank;
      for (int j = 0; j < i; ++j)
        if (reply[0] == ncclSuccess && all[i].device == all[j].device && std::strcmp(all[i].host, all[j].host) == 0) {
          std::fprintf(stderr, "NCCL WARN Duplicate GPU detected: rank %d and rank %d both on device %d of %s\n", j, i,
                       all[i].device, all[i].host);
          reply[0] = ncclInvalidUsage;
        }
    }
    for (int i = 0; i < nranks; ++i)
      if (i != rank)
        mpi_ok(MPI_Send(reply.data(), 1 + nranks, MPI_INT, all[i].world_rank, reply_tag, MPI_COMM_WORLD), "MPI_Send");
  } else {
    mpi_ok(MPI_Send(&me, sizeof me, MPI_BYTE, id.creator, tag, MPI_COMM_WORLD), "MPI_Send");
    mpi_ok(MPI_Recv(reply.data(), 1 + nranks, MPI_INT, id.creator, reply_tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
           "MPI_Recv");
  }
  if (reply[0] != ncclSuccess) return ncclResult_t(reply[0]);

  auto s = std::make_shared<State>();
  MPI_Group world_group, group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, nranks, reply.data() + 1, &group);
  mpi_ok(MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &s->comm), "MPI_Comm_create_group");
  MPI_Group_free(&group), MPI_Group_free(&world_group);
  MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(s->comm, &s->rank), MPI_Comm_size(s->comm, &s->size);
  if (s->rank != rank || s->size != nranks) fail(call + ": the MPI group does not match the NCCL ranks");
  s->device = me.device;
  *comm = new ncclComm{std::move(s)};
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  if (comm->destroyed) fail("ncclCommDestroy: communicator destroyed twice");
  comm->destroyed = true;
  comm->state.reset();  // the MPI communicator goes with the last queued collective
  return ncclSuccess;
}
// From any thread: the collective in progress returns (execute, agree), the handle
// and its state stay allocated (the stream's thread may still be inside them) and the
// communicator refuses further use.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  if (comm->state) comm->state->aborted = true;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (!comm || !asyncError) return ncclInvalidArgument;
  *asyncError = comm->state ? ncclResult_t(comm->state->async_error.load()) : ncclSuccess;
  return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!comm || comm->destroyed || !count) return ncclInvalidArgument;
  *count = comm->state->size;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!comm || comm->destroyed || !rank) return ncclInvalidArgument;
  *rank = comm->state->rank;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return submit(kAllReduce, sendbuff, recvbuff, count, datatype, op, 0, comm, stream, __builtin_return_address(0));
}
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return submit(kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream, __builtin_return_address(0));
}
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return submit(kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream, __builtin_return_address(0));
}
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return submit(kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream, __builtin_return_address(0));
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  return submit(kReduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream, __builtin_return_address(0));
}

ncclResult_t ncclGroupStart() {
  ++g_group_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (g_group_depth == 0) return ncclInvalidUsage;
  --g_group_depth;
  return ncclSuccess;
}
