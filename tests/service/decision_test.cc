// The decision's prices: a plan is priced as the job's step time per
// micro-batch (the simulator's iteration of the schedule, plus what the
// measured step holds beyond the model), so what it predicts to gain is
// what its realized gain measures; the slowest stage rides along for the
// auto gate's noise test.
#include "coordinator/job/decision.h"

#include <vector>

#include "core/measures.h"
#include "gtest/gtest.h"

namespace dynmo::service {
namespace {

// Ten equal layers of 1 s (F 1/3, B 2/3) on two stages, 0,9,10: the first
// stage holds nine of them.
DecisionInput Skewed(int microbatches) {
  DecisionInput in;
  for (int l = 0; l < 10; ++l) {
    core::LayerCost c;
    c.id = l;
    c.fwd_s = 1.0 / 3;
    c.bwd_s = 2.0 / 3;
    c.resident_bytes = 1 << 20;
    in.model.layers.push_back(c);
  }
  in.model.stages.assign(2, core::StageSpec{});
  in.active_stages = {0, 1};
  in.current = {0, 9, 10};
  in.policy.trigger = Trigger{Trigger::Kind::kAuto};
  in.microbatches = microbatches;
  return in;
}

TEST(DecisionPriceTest, APlanIsPricedAsTheStepTimeNotTheSlowestStage) {
  absl::StatusOr<Decision> d = Decide(Skewed(8));
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->changes_layout);
  EXPECT_EQ(d->boundaries, (core::Boundaries{0, 5, 10}));
  // The slowest stage: 9 s -> 5 s (+80%); the 1F1B iteration of 8
  // micro-batches: 8 x 9 -> 9 x 5 (+60%), per micro-batch.
  EXPECT_NEAR(d->previous_stage_s, 9, 1e-9);
  EXPECT_NEAR(d->predicted_stage_s, 5, 1e-9);
  EXPECT_NEAR(d->previous_bottleneck_s, 72.0 / 8, 1e-9);
  EXPECT_NEAR(d->predicted_bottleneck_s, 45.0 / 8, 1e-9);
}

TEST(DecisionPriceTest, TheMeasuredStepBeyondTheModelIsInEveryPrice) {
  DecisionInput in = Skewed(8);
  in.measured_iteration_s = 72 + 28;  // 28 s the layers do not explain
  absl::StatusOr<Decision> d = Decide(in);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_NEAR(d->previous_bottleneck_s, 100.0 / 8, 1e-9);
  EXPECT_NEAR(d->predicted_bottleneck_s, 73.0 / 8, 1e-9);
  // A measured step below the model's adds nothing (the model is not
  // shortened by it).
  in.measured_iteration_s = 50;
  d = Decide(in);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_NEAR(d->previous_bottleneck_s, 72.0 / 8, 1e-9);
}

TEST(DecisionPriceTest, OneMicroBatchHasNothingToGainFromARebalance) {
  absl::StatusOr<Decision> d = Decide(Skewed(1));
  ASSERT_TRUE(d.ok()) << d.status();
  // The balancer still evens the stages; the step time (both stages, one
  // after the other) does not change.
  EXPECT_NEAR(d->previous_bottleneck_s, 10, 1e-9);
  EXPECT_NEAR(d->predicted_bottleneck_s, 10, 1e-9);
  EXPECT_GT(d->previous_stage_s, d->predicted_stage_s);
}

TEST(DecisionPriceTest, AStragglersExchangesArePricedAtItsSpeed) {
  DecisionInput in = Skewed(8);
  in.current = {0, 5, 10};
  in.model.stages[1].speed = 0.5;
  in.model.stages[1].exchange_s = 0.5;  // its copies run at its pace too
  absl::StatusOr<Decision> d = Decide(in);
  ASSERT_TRUE(d.ok()) << d.status();
  const std::vector<double> loads = core::StageLoads(in.model, in.current);
  EXPECT_NEAR(d->previous_stage_s, (5 + 0.5) / 0.5, 1e-9);
  EXPECT_NEAR(loads[1], d->previous_stage_s, 1e-9);
  EXPECT_LT(d->predicted_bottleneck_s, d->previous_bottleneck_s);
  EXPECT_GT(d->boundaries[1], 5) << "layers leave the straggler";
}

TEST(DecisionPriceTest, AnUnchangedLayoutPredictsItsOwnPrice) {
  DecisionInput in = Skewed(8);
  in.current = {0, 5, 10};
  absl::StatusOr<Decision> d = Decide(in);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->changes_layout);
  EXPECT_EQ(d->predicted_bottleneck_s, d->previous_bottleneck_s);
  EXPECT_EQ(d->predicted_stage_s, d->previous_stage_s);
}

}  // namespace
}  // namespace dynmo::service
