#include "coordinator/job/plan_gains.h"

#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace dynmo::service {
namespace {

TEST(PlanGainsTest, APlanIsMeasuredOnceItsWindowAfterIsIn) {
  PlanGains gains;
  for (int64_t i = 0; i < 20; ++i) gains.AddStep(i, 2.0);
  EXPECT_FALSE(gains.Follow(1, 20, 0.25).has_value()) << "nothing followed before";
  for (int64_t i = 20; i < 29; ++i) {
    gains.AddStep(i, 1.6);
    EXPECT_FALSE(gains.Due().has_value()) << i;
  }
  gains.AddStep(29, 1.6);
  const std::optional<PlanGains::Measured> m = gains.Due();
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->epoch, 1u);
  EXPECT_NEAR(m->realized.gain, 0.25, 1e-12);
  EXPECT_EQ(gains.record().size(), 1);
  EXPECT_FALSE(gains.Due().has_value()) << "measured once";
}

TEST(PlanGainsTest, APlanFollowedSoonByTheNextIsMeasuredBeforeThatSwitch) {
  PlanGains gains;
  for (int64_t i = 0; i < 20; ++i) gains.AddStep(i, 2.0);
  gains.Follow(1, 20, 0.25);
  for (int64_t i = 20; i < 27; ++i) gains.AddStep(i, 1.6);
  // The next plan switches at 27: plan 1's after-window is 22..25.
  const std::optional<PlanGains::Measured> m = gains.Follow(2, 27, 0.1);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->epoch, 1u);
  EXPECT_EQ(m->realized.samples_after, 4);
  EXPECT_NEAR(m->realized.gain, 0.25, 1e-12);
}

TEST(PlanGainsTest, TheCurrentStepTimeIsTheApplyingPlansLayoutsOwn) {
  PlanGains gains;
  EXPECT_FALSE(gains.CurrentStepTime().has_value());
  for (int64_t i = 0; i < 20; ++i) gains.AddStep(i, 2.0);
  EXPECT_DOUBLE_EQ(*gains.CurrentStepTime(), 2.0);
  gains.Follow(1, 20, 0.25);
  for (int64_t i = 20; i < 23; ++i) gains.AddStep(i, 1.6);
  EXPECT_FALSE(gains.CurrentStepTime().has_value()) << "22 alone since the switch";
  gains.AddStep(23, 1.6);
  gains.AddStep(24, 1.6);
  EXPECT_DOUBLE_EQ(*gains.CurrentStepTime(), 1.6);
  gains.Forget();
  EXPECT_FALSE(gains.CurrentStepTime().has_value());
}

// The iterations around a switch (the one preparing, the migration's, the
// first on the new layout) are known from the plan in flight's apply
// iteration on, and from the followed plan's after it applied; and after
// a switch the layout is being measured until three step times are in.
TEST(PlanGainsTest, TheIterationsAroundASwitchAndTheLayoutBeingMeasured) {
  PlanGains gains;
  EXPECT_FALSE(gains.MeasuringLayout(0)) << "no step time reported: nothing to wait for";
  EXPECT_FALSE(gains.AroundSwitch(20));
  EXPECT_TRUE(gains.AroundSwitch(19, /*pending_apply=*/20));
  EXPECT_TRUE(gains.AroundSwitch(21, 20));
  EXPECT_FALSE(gains.AroundSwitch(18, 20));
  EXPECT_FALSE(gains.AroundSwitch(22, 20));
  gains.AddStep(0, 2.0);
  EXPECT_FALSE(gains.MeasuringLayout(0)) << "the job's start: no switch yet";
  for (int64_t i = 1; i < 20; ++i) gains.AddStep(i, 2.0);
  EXPECT_FALSE(gains.MeasuringLayout(19));
  gains.Follow(1, 20, 0.25);
  EXPECT_TRUE(gains.AroundSwitch(20)) << "the followed plan's switch";
  EXPECT_TRUE(gains.AroundSwitch(19));
  EXPECT_FALSE(gains.AroundSwitch(22));
  for (int64_t i = 20; i < 24; ++i) {
    gains.AddStep(i, 1.6);
    EXPECT_TRUE(gains.MeasuringLayout(i)) << i;
  }
  EXPECT_FALSE(gains.MeasuringLayout(30)) << "a job whose step times stopped is not waited for";
  gains.AddStep(24, 1.6);
  EXPECT_FALSE(gains.MeasuringLayout(24)) << "22, 23 and 24 measured the new layout";
  gains.Forget();
  EXPECT_FALSE(gains.AroundSwitch(20));
  EXPECT_FALSE(gains.MeasuringLayout(24));
}

// A freeze at 19 makes the steps after a plan applied at 20 faster by
// itself: the measurement (+25% against +20% predicted) is shown, marked,
// and kept out of the record the gate calibrates by. A change before the
// first iteration measured, or after the last, leaves the plan's
// measurement its own.
TEST(PlanGainsTest, AModelChangeInsideTheWindowsMarksTheMeasurement) {
  for (const auto& [change, marked] :
       std::vector<std::pair<int64_t, bool>>{{19, true}, {12, true}, {11, false}, {29, true},
                                             {30, false}}) {
    PlanGains gains;
    for (int64_t i = 0; i < 20; ++i) gains.AddStep(i, 2.0);
    gains.NoteModelChange(change);
    gains.Follow(1, 20, 0.20);
    for (int64_t i = 20; i < 30; ++i) gains.AddStep(i, 1.6);
    const std::optional<PlanGains::Measured> m = gains.Due();
    ASSERT_TRUE(m.has_value()) << change;
    EXPECT_EQ(m->realized.model_changed, marked) << change;
    EXPECT_EQ(gains.record().size(), marked ? 0 : 1) << change;
  }
}

// A plan that fell short across a change still tightens the gate.
TEST(PlanGainsTest, AShortfallAcrossAModelChangeIsStillRecorded) {
  PlanGains gains;
  for (int64_t i = 0; i < 20; ++i) gains.AddStep(i, 2.0);
  gains.NoteModelChange(24);
  gains.Follow(1, 20, 0.50);  // +50% predicted, +25% delivered
  for (int64_t i = 20; i < 30; ++i) gains.AddStep(i, 1.6);
  const std::optional<PlanGains::Measured> m = gains.Due();
  ASSERT_TRUE(m.has_value());
  EXPECT_TRUE(m->realized.model_changed);
  ASSERT_EQ(gains.record().size(), 1);
  EXPECT_NEAR(*gains.record().MedianShortfall(), 0.25, 1e-12);
}

TEST(PlanGainsTest, TooFewStepTimesOrAResumeMeasureNothing) {
  PlanGains gains;
  gains.Follow(1, 20, 0.25);  // no step times at all (a trainer without them)
  for (int64_t i = 20; i < 40; ++i) EXPECT_FALSE(gains.Due().has_value());
  for (int64_t i = 0; i < 20; ++i) gains.AddStep(i, 2.0);
  gains.Follow(2, 20, 0.25);
  gains.Forget();  // resumed from a checkpoint
  for (int64_t i = 20; i < 40; ++i) gains.AddStep(i, 1.0);
  EXPECT_FALSE(gains.Due().has_value());
  EXPECT_EQ(gains.record().size(), 0);
}

}  // namespace
}  // namespace dynmo::service
