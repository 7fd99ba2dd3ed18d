// The 1F1B order (lns/pipeline_schedule.h) as a pure function, against its contract
// rather than its own formula: every micro-batch runs forward once and backward once,
// forward before backward, backwards in micro-batch order, at most slots_for() in
// flight, and the example of docs/parallelism.md. tests/mpi/ runs it across ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "lns/pipeline_schedule.h"

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
        EXPECT_EQ(PipelineSchedule1F1B::slots_for(M, s, P), bound);
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
