// The 1F1B order (lns/train/pipeline_schedule.h) as a pure function, against its contract
// rather than its own formula: every micro-batch runs forward once and backward once,
// forward before backward, backwards in micro-batch order, at most chunk_slots() in
// flight, and the example of docs/parallelism.md. tests/mpi/ runs it across ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "lns/core/errors.h"
#include "lns/train/pipeline_schedule.h"

namespace lns {
namespace {

TEST(Schedule1F1B, EveryMicroBatchOnceForwardBeforeBackwardWithinSlots) {
  for (int P = 1; P <= 5; ++P)
    for (int M = 1; M <= 9; ++M)
      for (int s = 0; s < P; ++s) {
        const std::vector<PipelineOp> ops = schedule_1f1b(M, s, P);
        ASSERT_EQ(static_cast<int>(ops.size()), 2 * M) << "M " << M << " stage " << s << "/" << P;
        std::vector<int> fwd(M, 0), bwd(M, 0);
        int in_flight = 0, most = 0, next_bwd = 0;
        for (const PipelineOp& op : ops) {
          ASSERT_TRUE(op.micro >= 0 && op.micro < M);
          if (op.forward) {
            ++fwd[op.micro], ++in_flight;
          } else {
            EXPECT_EQ(fwd[op.micro], 1) << "backward of " << op.micro << " before its forward";
            EXPECT_EQ(op.micro, next_bwd++) << "backwards run in micro-batch order";
            ++bwd[op.micro], --in_flight;
          }
          most = std::max(most, in_flight);
        }
        for (int m = 0; m < M; ++m) EXPECT_TRUE(fwd[m] == 1 && bwd[m] == 1) << m;
        // Stage s can start its first backward only after P - s forwards reached the
        // last stage: min(M, P - s) is both the bound and what the schedule reaches.
        const int bound = std::min(M, P - s);
        EXPECT_EQ(most, bound) << "M " << M << " stage " << s << "/" << P;
        EXPECT_EQ(chunk_slots(M, s, P, 1), std::vector<int>{bound});
      }
}

std::string render(const std::vector<PipelineOp>& ops) {
  std::string s;
  for (const PipelineOp& op : ops) {
    if (!s.empty()) s.push_back(' ');
    s.push_back(op.forward ? 'F' : 'B');
    s.append(std::to_string(op.micro));
  }
  return s;
}

TEST(Schedule1F1B, TheExampleOfTheDocs) {
  // docs/parallelism.md, M = 4, P = 2.
  EXPECT_EQ(render(schedule_1f1b(4, 0, 2)), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(render(schedule_1f1b(4, 1, 2)), "F0 B0 F1 B1 F2 B2 F3 B3");
  EXPECT_EQ(render(schedule_1f1b(2, 0, 4)), "F0 F1 B0 B1");  // fewer micro-batches than stages
}

}  // namespace
}  // namespace lns

namespace lns {
namespace {

// Every rank of a pipeline running its op list, as the ranks do: sends never block,
// an op waits for its input (the previous model chunk's forward of the same
// micro-batch, the next chunk's backward) and for the rank to be free. Forward ops
// take f time units, backward ops b. Model chunk k = c*P + s is chunk c of rank s.
struct Timeline {
  bool deadlock = false;
  std::string error;    // the first broken dependency, if any
  int64_t makespan = 0;  // until the last op of any rank ends
  int64_t ideal = 0;     // one rank's ops back to back
};

Timeline simulate(int M, int P, int V, int f, int b) {
  Timeline t;
  std::vector<std::vector<PipelineOp>> ops(P);
  for (int s = 0; s < P; ++s) ops[s] = pipeline_schedule(M, s, P, V);
  // done[dir][s][c][m]: finish time, -1 while not run
  std::vector<std::vector<std::vector<std::vector<int64_t>>>> done(
      2, std::vector<std::vector<std::vector<int64_t>>>(P, std::vector<std::vector<int64_t>>(V, std::vector<int64_t>(M, -1))));
  std::vector<size_t> pos(P, 0);
  std::vector<int64_t> free(P, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < P; ++s)
      while (pos[s] < ops[s].size()) {
        const PipelineOp op = ops[s][pos[s]];
        const int m = op.micro, c = op.chunk, dir = op.forward ? 0 : 1;
        if (m < 0 || m >= M || c < 0 || c >= V || done[dir][s][c][m] >= 0) {
          t.error = "rank " + std::to_string(s) + ": op out of range or repeated";
          t.deadlock = true;
          return t;
        }
        int64_t ready = 0;
        if (op.forward) {
          if (s > 0) ready = done[0][s - 1][c][m];
          else if (c > 0) ready = done[0][P - 1][c - 1][m];
        } else {
          if (done[0][s][c][m] < 0) {
            t.error = "rank " + std::to_string(s) + ": backward of micro-batch " + std::to_string(m) + " chunk " +
                      std::to_string(c) + " before its forward";
            t.deadlock = true;
            return t;
          }
          if (s < P - 1) ready = done[1][s + 1][c][m];
          else if (c < V - 1) ready = done[1][0][c + 1][m];
          else ready = done[0][s][c][m];  // the loss: after this micro-batch's last forward
        }
        if (ready < 0) break;  // the rank waits in its receive
        const int64_t start = std::max(free[s], ready);
        free[s] = done[dir][s][c][m] = start + (op.forward ? f : b);
        ++pos[s];
        progress = true;
      }
  }
  for (int s = 0; s < P; ++s) {
    if (pos[s] < ops[s].size()) t.deadlock = true, t.error = "rank " + std::to_string(s) + " waits forever";
    t.makespan = std::max(t.makespan, free[s]);
  }
  t.ideal = int64_t{M} * V * (f + b);
  return t;
}

TEST(ScheduleInterleaved, EveryChunkOfEveryMicroBatchOnceInOrderWithinSlots) {
  for (int P = 2; P <= 5; ++P)
    for (int V = 2; V <= 4; ++V)
      for (int M = P; M <= 4 * P; M += P)
        for (int s = 0; s < P; ++s) {
          const std::vector<PipelineOp> ops = schedule_interleaved(M, s, P, V);
          const std::string at = "M " + std::to_string(M) + " V " + std::to_string(V) + " stage " +
                                 std::to_string(s) + "/" + std::to_string(P);
          ASSERT_EQ(static_cast<int>(ops.size()), 2 * M * V) << at;
          EXPECT_EQ(ops, pipeline_schedule(M, s, P, V)) << at;
          std::vector<std::vector<int>> fwd(V, std::vector<int>(M, 0)), bwd = fwd;
          std::vector<int> next_fwd(V, 0), next_bwd(V, 0), in_flight(V, 0), most(V, 0);
          const std::vector<int> slots = chunk_slots(M, s, P, V);
          ASSERT_EQ(static_cast<int>(slots.size()), V);
          int total = 0, most_total = 0;
          for (const PipelineOp& op : ops) {
            ASSERT_TRUE(op.micro >= 0 && op.micro < M && op.chunk >= 0 && op.chunk < V) << at;
            const int c = op.chunk, m = op.micro;
            if (op.forward) {
              EXPECT_EQ(m, next_fwd[c]++) << at << ": forwards of a chunk in micro-batch order";
              ++fwd[c][m], ++in_flight[c], ++total;
            } else {
              EXPECT_EQ(fwd[c][m], 1) << at << ": backward of " << m << " chunk " << c << " before its forward";
              EXPECT_EQ(m, next_bwd[c]++) << at << ": backwards of a chunk in micro-batch order";
              ++bwd[c][m], --in_flight[c], --total;
            }
            most[c] = std::max(most[c], in_flight[c]);
            most_total = std::max(most_total, total);
            // The slot of micro-batch m in chunk c is m % slots[c]: the micro-batches in
            // flight are consecutive, so no two share a slot.
            EXPECT_LE(in_flight[c], slots[c]) << at;
          }
          for (int c = 0; c < V; ++c)
            for (int m = 0; m < M; ++m) EXPECT_TRUE(fwd[c][m] == 1 && bwd[c][m] == 1) << at << " m " << m << " c " << c;
          EXPECT_EQ(most, slots) << at;
          // Megatron's bound: the warm-up forwards plus the one of the first steady step.
          const int warmup = M == P ? M * V : std::min(M * V, 2 * (P - s - 1) + (V - 1) * P);
          EXPECT_EQ(most_total, std::min(M * V, warmup + 1)) << at;
        }
}

TEST(ScheduleInterleaved, ChunkOrderOfTheDocs) {
  // docs/parallelism.md: P = 2, V = 2, M = 4; "F1.0" = forward of micro-batch 1, chunk 0.
  const auto render = [](const std::vector<PipelineOp>& ops) {
    std::string s;
    for (const PipelineOp& op : ops)
      s += (s.empty() ? "" : " ") + std::string(op.forward ? "F" : "B") + std::to_string(op.micro) + "." +
           std::to_string(op.chunk);
    return s;
  };
  EXPECT_EQ(render(schedule_interleaved(4, 0, 2, 2)), "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(render(schedule_interleaved(4, 1, 2, 2)), "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
}

// Every rank runs its list to the end (no rank waits for a message that is never
// sent), and the timeline's idle time is the bubble pipeline_bubble() logs:
// (P-1)/(V*M) of the ideal, for V = 1 (1F1B) and V > 1 alike.
TEST(ScheduleInterleaved, NoDeadlockAndTheBubbleShrinksByV) {
  for (int P = 1; P <= 5; ++P)
    for (int V = 1; V <= 4; ++V) {
      if (P == 1 && V > 1) continue;  // refused by layout_for_model
      for (int M = P; M <= 4 * P; M += P)
        for (auto [f, b] : {std::pair{1, 1}, std::pair{1, 2}}) {
          const Timeline t = simulate(M, P, V, f, b);
          const std::string at = "M " + std::to_string(M) + " P " + std::to_string(P) + " V " + std::to_string(V);
          ASSERT_FALSE(t.deadlock) << at << ": " << t.error;
          EXPECT_NEAR(double(t.makespan - t.ideal) / t.ideal, pipeline_bubble(M, P, V), 1e-12)
              << at << " f " << f << " b " << b << ": makespan " << t.makespan << ", ideal " << t.ideal;
        }
    }
}

TEST(ScheduleInterleaved, MicroBatchesNotAMultipleOfTheStagesAreRefused) {
  check_micro_batches(3, 2, 1);  // plain 1F1B takes any count
  check_micro_batches(8, 4, 2);
  try {
    check_micro_batches(6, 4, 2);
    FAIL() << "6 micro-batches over 4 stages with 2 virtual stages were accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--virtual_stages=2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("multiple of --pp=4"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lns
