// Delayed FP8 scaling (include/lns/core/fp8_recipe.h) against Transformer Engine's recipe
// written out here: scale = fp8_max / amax_h / 2^margin over the amax history, kept
// when the amax is 0 or not finite; its state through a checkpoint round trip; and
// one-line errors for a bad setting or a damaged state.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "lns/core/errors.h"
#include "lns/core/fp8_recipe.h"

namespace lns {
namespace {

Fp8ScalingConfig cfg(int history, int margin = 0, bool most_recent = false) {
  Fp8ScalingConfig c;
  c.history = history, c.margin = margin, c.most_recent = most_recent;
  return c;
}

TEST(Fp8Scaling, FollowsTheRecipe) {
  Fp8DelayedScale s(Fp8Format::E4M3, cfg(2));
  EXPECT_EQ(s.scale(), 1.0f);  // nothing seen
  s.record(0.0f);
  EXPECT_EQ(s.scale(), 1.0f);  // no signal: unchanged
  s.record(2.0f);
  EXPECT_EQ(s.scale(), 224.0f);  // 448 / 2
  EXPECT_EQ(s.inverse(), 1.0f / 224.0f);
  s.record(1.0f);  // history [2, 1]: the max still 2
  EXPECT_EQ(s.scale(), 224.0f);
  s.record(1.0f);  // [1, 1]: 2 has left the window
  EXPECT_EQ(s.scale(), 448.0f);
  s.record(NAN);  // an overflowed cast: [1, 0], the max is 1
  EXPECT_EQ(s.scale(), 448.0f);
  s.record(INFINITY);  // [0, 0]: no signal at all, the scale stays
  EXPECT_EQ(s.scale(), 448.0f);

  Fp8DelayedScale m(Fp8Format::E5M2, cfg(16, 2));
  m.record(3.0f);
  EXPECT_EQ(m.scale(), float(57344.0 / 3.0 / 4.0));  // two binades of margin
  Fp8DelayedScale r(Fp8Format::E4M3, cfg(16, 0, /*most_recent=*/true));
  r.record(8.0f), r.record(0.5f);
  EXPECT_EQ(r.scale(), 896.0f);  // the newest amax only
}

TEST(Fp8Scaling, StateRoundTripsThroughACheckpoint) {
  Fp8DelayedScale a(Fp8Format::E4M3, cfg(3)), b(Fp8Format::E4M3, cfg(3));
  for (float x : {5.0f, 7.0f, 2.0f, 3.0f}) a.record(x);
  b.restore(a.state(), "ckpt");
  EXPECT_EQ(b.scale(), a.scale());
  for (float x : {1.0f, 1.0f, 9.0f, 0.5f}) {  // the same scales from here on
    a.record(x), b.record(x);
    EXPECT_EQ(b.scale(), a.scale()) << x;
  }
}

void expect_error(const std::function<void()>& f, const std::string& want) {
  try {
    f();
    FAIL() << "no error, expected: " << want;
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), want);
  }
}

TEST(Fp8Scaling, BadSettingsAndDamagedStatesAreOneLineErrors) {
  expect_error([] { cfg(0).validate(); }, "--fp8_amax_history=0: expected 1 to 1048576 steps");
  expect_error([] { cfg(4, 65).validate(); }, "--fp8_margin=65: expected 0 to 64 binades");
  Fp8DelayedScale s(Fp8Format::E4M3, cfg(2));
  expect_error([&] { s.restore({1.0f, 0.0f, 0.0f}, "rank 0"); },
               "rank 0: FP8 scaling state has 3 values, expected 5 (3 + --fp8_amax_history=2)");
  expect_error([&] { s.restore({0.0f, 0.0f, 0.0f, 0.0f, 0.0f}, "rank 0"); },
               "rank 0: FP8 scale 0 is not a positive finite number");
  expect_error([&] { s.restore({1.0f, 3.0f, 0.0f, 0.0f, 0.0f}, "rank 0"); },
               "rank 0: FP8 scaling state's count 3 is not a whole number in 0..2");
  expect_error([&] { s.restore({1.0f, 1.0f, 0.5f, 0.0f, 0.0f}, "rank 0"); },
               "rank 0: FP8 scaling state's position 0.5 is not a whole number in 0..1");
  expect_error([&] { s.restore({1.0f, 1.0f, 1.0f, -2.0f, 0.0f}, "rank 0"); },
               "rank 0: FP8 amax history entry -2 is not finite and >= 0");
  EXPECT_EQ(s.scale(), 1.0f);  // a refused state changes nothing
}

}  // namespace
}  // namespace lns
