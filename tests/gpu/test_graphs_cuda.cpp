// --cuda_graphs on the device (label `gpu`; skips without a GPU): the graphed step gives
// the ungraphed step's bits, losses and weights after three steps. The emulator's
// version (test_sim_checks.cpp, SimGraphsScheme) also counts the launches; this one is
// for a real GPU, where capture, instantiation and replay are the driver's.
#include <gtest/gtest.h>

#include <cstring>

#include "lns/core/device.h"
#include "tests/gpu/graphed_steps.h"

namespace lns {
namespace {

class CudaGraphs : public ::testing::TestWithParam<NormScheme> {};

TEST_P(CudaGraphs, GraphedStepsEqualUngraphedBitForBit) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "skipped: " << cuda_unavailable_reason();
  const test::GraphedSteps plain = test::run_graphed_steps(GetParam(), 4, false);
  const test::GraphedSteps graphed = test::run_graphed_steps(GetParam(), 4, true);
  for (int step = 0; step < 3; ++step) EXPECT_EQ(graphed.losses[step], plain.losses[step]) << "step " << step + 1;
  ASSERT_EQ(graphed.weights.size(), plain.weights.size());
  EXPECT_EQ(0, std::memcmp(graphed.weights.data(), plain.weights.data(), plain.weights.size() * 4));
}
INSTANTIATE_TEST_SUITE_P(Schemes, CudaGraphs, ::testing::Values(NormScheme::LNS, NormScheme::Routed),
                         [](const auto& info) { return std::string(norm_scheme_name(info.param)); });

}  // namespace
}  // namespace lns
