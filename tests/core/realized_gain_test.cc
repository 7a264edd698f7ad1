#include "core/realized_gain.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace dynmo::core {
namespace {

TEST(StepTimesTest, KeepsTheLargestPerIterationAndTheNewestCapacity) {
  StepTimes steps(/*capacity=*/4);
  steps.Add(1, 1.0);
  steps.Add(1, 1.5);  // the slowest rank's
  steps.Add(1, 0.5);
  steps.Add(3, 2.0);
  steps.Add(2, 3.0);  // late, in its place
  steps.Add(4, std::numeric_limits<double>::quiet_NaN());  // ignored
  steps.Add(4, -1);                                         // ignored
  EXPECT_EQ(steps.Range(0, 10), (std::vector<double>{1.5, 3.0, 2.0}));
  steps.Add(4, 1.0);
  steps.Add(5, 1.0);
  EXPECT_EQ(steps.Range(0, 10), (std::vector<double>{3.0, 2.0, 1.0, 1.0}));
  steps.Add(1, 9.0);  // older than everything kept
  EXPECT_EQ(steps.Range(0, 10).size(), 4u);
  EXPECT_EQ(steps.newest(), 5);
}

TEST(RealizedGainTest, ComparesTheMediansAroundTheSwitchLeavingItsIterationsOut) {
  StepTimes steps;
  // 2.0 s per step up to the plan applied at 20, 1.6 s after it; the
  // migration's iterations (19, 20, 21) are slow and must not count.
  for (int64_t i = 0; i < 40; ++i) {
    double s = i < 20 ? 2.0 : 1.6;
    if (i >= 19 && i <= 21) s = 9.0;
    if (i == 12) s = 2.4;  // one noisy step: the median ignores it
    steps.Add(i, s);
  }
  const GainWindows w;
  EXPECT_EQ(AfterWindowEnd(20, w), 29);
  const std::optional<RealizedGain> g = MeasureRealizedGain(steps, 20, w);
  ASSERT_TRUE(g.has_value());
  EXPECT_DOUBLE_EQ(g->before_s, 2.0);
  EXPECT_DOUBLE_EQ(g->after_s, 1.6);
  EXPECT_NEAR(g->gain, 0.25, 1e-12);
  EXPECT_DOUBLE_EQ(g->spread, 0.0);
  EXPECT_EQ(g->samples_before, 8);
  EXPECT_EQ(g->samples_after, 8);
}

TEST(RealizedGainTest, TooFewStepTimesMeasureNothing) {
  StepTimes steps;
  for (int64_t i = 10; i < 24; ++i) steps.Add(i, 1.0);
  EXPECT_FALSE(MeasureRealizedGain(steps, 20, GainWindows{}).has_value())
      << "only 22 and 23 after the switch";
  steps.Add(24, 1.0);
  EXPECT_TRUE(MeasureRealizedGain(steps, 20, GainWindows{}).has_value());
}

TEST(RealizedGainTest, TheJobsFirstIterationsAreNeverMeasured) {
  // A job's first two iterations run at 3 s (warm-up), then 2 s up to a
  // plan applied at 6, 1.6 s after it: the before-window is iterations
  // 2..4 only, and the gain is the layout's, not the warm-up's.
  StepTimes steps;
  for (int64_t i = 0; i < 20; ++i) steps.Add(i, i < 2 ? 3.0 : (i < 6 ? 2.0 : 1.6));
  EXPECT_EQ(steps.first(), 0);
  const std::optional<RealizedGain> g = MeasureRealizedGain(steps, 6, GainWindows{});
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->samples_before, 3);
  EXPECT_DOUBLE_EQ(g->before_s, 2.0);
  EXPECT_NEAR(g->gain, 0.25, 1e-12);
  // A plan applied at 5 has two measurable iterations before it: nothing.
  EXPECT_FALSE(MeasureRealizedGain(steps, 5, GainWindows{}).has_value());
  // A job resumed at iteration 100 warms up again there.
  StepTimes resumed;
  for (int64_t i = 100; i < 120; ++i) resumed.Add(i, i < 102 ? 3.0 : (i < 106 ? 2.0 : 1.6));
  EXPECT_EQ(resumed.first(), 100);
  EXPECT_DOUBLE_EQ(MeasureRealizedGain(resumed, 106, GainWindows{})->before_s, 2.0);
  GainWindows none;
  none.warmup = 0;
  EXPECT_EQ(MeasureRealizedGain(resumed, 106, none)->samples_before, 5)
      << "without a warm-up the window reaches back to 100";
}

TEST(CurrentStepTimeTest, TheNewestStepsOnTheLayoutSinceItsSwitch) {
  StepTimes steps;
  const GainWindows w;  // before 8, warm-up 2, at least 3
  EXPECT_FALSE(CurrentStepTime(steps, -1, w).has_value());
  steps.Add(0, 9.0);  // warm-up
  steps.Add(1, 9.0);
  steps.Add(2, 2.0);
  steps.Add(3, 2.0);
  EXPECT_FALSE(CurrentStepTime(steps, -1, w).has_value()) << "two after the warm-up";
  steps.Add(4, 2.2);
  EXPECT_DOUBLE_EQ(*CurrentStepTime(steps, -1, w), 2.0);
  // A plan switched at 20 (since 22): only the steps from 22 on count.
  for (int64_t i = 5; i < 22; ++i) steps.Add(i, 2.0);
  steps.Add(22, 1.5);
  steps.Add(23, 1.5);
  EXPECT_FALSE(CurrentStepTime(steps, 22, w).has_value());
  steps.Add(24, 1.6);
  EXPECT_DOUBLE_EQ(*CurrentStepTime(steps, 22, w), 1.5);
  // Of many, the newest eight.
  for (int64_t i = 25; i < 40; ++i) steps.Add(i, i < 32 ? 1.5 : 1.2);
  EXPECT_DOUBLE_EQ(*CurrentStepTime(steps, 22, w), 1.2);
}

TEST(PredictionRecordTest, TheMedianShortfallAndSpreadOfTheNewestPlans) {
  PredictionRecord record(/*capacity=*/3);
  EXPECT_FALSE(record.MedianShortfall().has_value());
  RealizedGain g;
  g.gain = 0.10;
  g.spread = 0.01;
  record.Add(0.12, g);  // 2 points short
  g.gain = 0.05;
  g.spread = 0.03;
  record.Add(0.05, g);  // on the mark
  g.gain = -0.02;
  g.spread = 0.02;
  record.Add(0.08, g);  // 10 points short
  EXPECT_NEAR(*record.MedianShortfall(), 0.02, 1e-12);
  EXPECT_NEAR(*record.MedianSpread(), 0.02, 1e-12);
  g.gain = 0.30;
  record.Add(0.07, g);  // delivered more than predicted: no shortfall
  EXPECT_EQ(record.size(), 3) << "the first one left";
  EXPECT_NEAR(*record.MedianShortfall(), 0.0, 1e-12);
}

TEST(MedianTest, OddEvenAndEmpty) {
  EXPECT_EQ(Median({}), 0);
  EXPECT_EQ(Median({3, 1, 2}), 2);
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);
}

}  // namespace
}  // namespace dynmo::core
