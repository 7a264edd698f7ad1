#include "coordinator/job/policy.h"

#include <random>

#include "gtest/gtest.h"

namespace dynmo::service {
namespace {

TEST(ParseTriggerTest, AcceptsEveryForm) {
  ASSERT_TRUE(ParseTrigger("auto").ok());
  ASSERT_TRUE(ParseTrigger("on-event").ok());
  ASSERT_TRUE(ParseTrigger("manual").ok());
  absl::StatusOr<Trigger> t = ParseTrigger("every:25");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->kind, Trigger::Kind::kEvery);
  EXPECT_EQ(t->every, 25);
  EXPECT_EQ(TriggerName(*t), "every:25");
}

TEST(ParseTriggerTest, RejectsMalformedWithMessage) {
  for (const char* bad : {"every:0", "every:", "every:x", "sometimes", ""}) {
    absl::StatusOr<Trigger> t = ParseTrigger(bad);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ParseTriggerTest, RefusesTheReplaysOnChangeSayingWhose) {
  absl::StatusOr<Trigger> t = ParseTrigger("on-change:0.1");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("replay"), absl::string_view::npos)
      << t.status();
}

TEST(EvaluateTriggerTest, EveryNCountsIterationsSinceTheLastDecision) {
  const Trigger every = ParseTrigger("every:5").value();
  EXPECT_FALSE(EvaluateTrigger(every, {/*since=*/4, false, false}).decide);
  TriggerCall call = EvaluateTrigger(every, {/*since=*/5, false, false});
  EXPECT_TRUE(call.decide);
  EXPECT_EQ(call.reason, "every:5");
}

TEST(EvaluateTriggerTest, OnEventWaitsForEveryRanksNewCosts) {
  const Trigger on_event = ParseTrigger("on-event").value();
  EXPECT_FALSE(EvaluateTrigger(on_event, {100, /*changed=*/false, true}).decide);
  TriggerCall waiting = EvaluateTrigger(on_event, {1, true, /*complete=*/false});
  EXPECT_FALSE(waiting.decide);
  EXPECT_EQ(waiting.note, "model changed: waiting for every rank's new costs");
  TriggerCall call = EvaluateTrigger(on_event, {1, true, true});
  EXPECT_TRUE(call.decide);
  EXPECT_EQ(call.reason, "on-event");
}

TEST(EvaluateTriggerTest, AutoAlwaysDecidesAndManualNever) {
  TriggerCall call = EvaluateTrigger(ParseTrigger("auto").value(), {0, false, false});
  EXPECT_TRUE(call.decide);
  EXPECT_EQ(call.reason, "auto");
  EXPECT_FALSE(
      EvaluateTrigger(ParseTrigger("manual").value(), {1000, true, true}).decide);
}

TEST(EvaluateAutoTest, ReleasingGpusPaysBackWithoutATimeGain) {
  AutoOptions o;
  AutoInput in{/*current=*/0.10, /*candidate=*/0.10, /*migration_bytes=*/1LL << 30,
               /*microbatches=*/8};
  EXPECT_FALSE(EvaluateAuto(o, in).pays_back);
  in.releases_gpus = true;
  EXPECT_TRUE(EvaluateAuto(o, in).pays_back);
}

TEST(EvaluateAutoTest, GainThatPaysBackMigrationIsAccepted) {
  AutoOptions o;  // horizon 200, 10 GB/s, margin 2, min gain 5%
  AutoInput in{/*current=*/0.10, /*candidate=*/0.08,
               /*migration_bytes=*/1LL << 30, /*microbatches=*/8};
  AutoVerdict v = EvaluateAuto(o, in);
  // gain = 0.02 * 8 * 200 = 32 s, migration = 0.107 s.
  EXPECT_TRUE(v.pays_back) << v.why;
  EXPECT_NEAR(v.gain_s, 32, 1e-9);
}

TEST(EvaluateAutoTest, MigrationTooExpensiveForTheHorizonIsRefused) {
  AutoOptions o;
  o.bandwidth_bytes_per_s = 1e6;  // a slow link
  AutoInput in{0.10, 0.09, 1LL << 30, 1};  // gain 2 s vs 1073 s
  EXPECT_FALSE(EvaluateAuto(o, in).pays_back);
}

TEST(EvaluateAutoTest, SmallRelativeGainIsRefusedEvenWhenFree) {
  AutoOptions o;
  AutoInput in{0.100, 0.099, 0, 8};  // 1% < 5%
  EXPECT_FALSE(EvaluateAuto(o, in).pays_back);
}

// Until the job's plans are measured the fixed minimum bounds the slowest
// stage's gain (the balancer's objective); calibrated, the job's error
// bounds the predicted step time's gain, the quantity it was measured on.
TEST(EvaluateAutoTest, TheMinimumBoundsTheStageUntilCalibratedThenTheStepTime) {
  AutoOptions o;  // min gain 5%
  AutoInput in{/*current=*/0.100, /*candidate=*/0.096, /*migration_bytes=*/0, 8};  // 4%
  in.current_stage_s = 0.080;
  in.candidate_stage_s = 0.072;  // 10% off the slowest stage
  AutoVerdict v = EvaluateAuto(o, in);
  EXPECT_TRUE(v.pays_back) << v.why;
  in.candidate_stage_s = 0.0784;  // 2%
  v = EvaluateAuto(o, in);
  EXPECT_FALSE(v.pays_back);
  EXPECT_NE(v.why.find("slowest stage's gain 2.00% below the 5.00%"), std::string::npos)
      << v.why;
  in.candidate_stage_s = 0.072;
  in.min_relative_gain = 0.045;  // the job's plans missed by 4.5 points
  v = EvaluateAuto(o, in);
  EXPECT_FALSE(v.pays_back);
  EXPECT_NE(v.why.find("step time's gain 4.00% below the 4.50% threshold (calibrated)"),
            std::string::npos)
      << v.why;
  in.min_relative_gain = 0.03;
  EXPECT_TRUE(EvaluateAuto(o, in).pays_back);
}

// The noise test weighs the slowest stage's gain, whose noise gain_noise_s
// is: a step-time gain diluted by the fill and drain is no noisier.
TEST(EvaluateAutoTest, TheNoiseTestWeighsTheSlowestStage) {
  AutoOptions o;  // 3 sd
  AutoInput in{/*current=*/0.100, /*candidate=*/0.090, /*migration_bytes=*/0, 8};
  in.current_stage_s = 0.080;
  in.candidate_stage_s = 0.068;  // 12 ms
  in.gain_noise_s = 0.0035;      // 3 sd = 10.5 ms: the stage's 12 ms passes
  EXPECT_TRUE(EvaluateAuto(o, in).pays_back) << EvaluateAuto(o, in).why;
  in.candidate_stage_s = 0.071;  // 9 ms, within the noise
  const AutoVerdict v = EvaluateAuto(o, in);
  EXPECT_FALSE(v.pays_back);
  EXPECT_NE(v.why.find("within timing noise"), std::string::npos) << v.why;
}

TEST(AutoGateTest, NeedsConsecutiveConfirmationsAndHonoursCooldown) {
  AutoOptions o;
  o.confirmations = 3;
  o.cooldown_iterations = 50;
  AutoGate gate(o);
  AutoVerdict yes;
  yes.pays_back = true;
  AutoVerdict no;
  EXPECT_FALSE(gate.Observe(yes, 1));
  EXPECT_FALSE(gate.Observe(no, 2));  // streak broken
  EXPECT_FALSE(gate.Observe(yes, 3));
  EXPECT_FALSE(gate.Observe(yes, 4));
  EXPECT_TRUE(gate.Observe(yes, 5));
  gate.OnPlanIssued(5);
  for (int it = 6; it < 55; ++it) EXPECT_FALSE(gate.Observe(yes, it)) << it;
  EXPECT_TRUE(gate.Observe(yes, 56));
}

// A plan decided for a model that changed after it was issued (freezing,
// pruning, a rank's speed) has its cool-down end once every rank reported
// the change; the confirmations still hold; a change at or before the issue
// ends nothing.
TEST(AutoGateTest, AModelChangeAfterThePlanEndsItsCooldown) {
  AutoOptions o;
  o.confirmations = 3;
  o.cooldown_iterations = 20;
  AutoGate gate(o);
  AutoVerdict yes;
  yes.pays_back = true;
  AutoVerdict no;
  gate.OnPlanIssued(5);
  EXPECT_FALSE(gate.Observe(yes, 10, /*settled_change=*/5));
  EXPECT_FALSE(gate.Observe(yes, 11, 5));
  EXPECT_FALSE(gate.Observe(yes, 12, 5)) << "a change at the issue ends no cool-down";
  EXPECT_TRUE(gate.Observe(yes, 14, 14)) << "settled at 14: the cool-down is over";
  gate.OnPlanIssued(14);
  for (int it = 15; it < 34; ++it) EXPECT_FALSE(gate.Observe(yes, it, 14)) << it;
  EXPECT_TRUE(gate.Observe(yes, 34, 14));
  gate.OnPlanIssued(34);
  EXPECT_FALSE(gate.Observe(no, 40, 38));
  EXPECT_FALSE(gate.Observe(yes, 41, 38));
  EXPECT_FALSE(gate.Observe(yes, 42, 38)) << "two confirmations are not three";
  EXPECT_TRUE(gate.Observe(yes, 43, 38));
}

TEST(EvaluateAutoTest, TheGainCountsOnlyOverTheIterationsTheRunHasLeft) {
  AutoOptions o;  // horizon 200, 10 GB/s, margin 2
  AutoInput in{/*current=*/0.10, /*candidate=*/0.08, /*migration_bytes=*/10LL << 30,
               /*microbatches=*/8};  // 0.16 s an iteration, 1.07 s to move
  EXPECT_TRUE(EvaluateAuto(o, in).pays_back);
  in.iterations_left = 20;  // 3.2 s >= 2 x 1.07 s
  AutoVerdict v = EvaluateAuto(o, in);
  EXPECT_TRUE(v.pays_back) << v.why;
  EXPECT_NEAR(v.gain_s, 0.02 * 8 * 20, 1e-9);
  in.iterations_left = 10;  // 1.6 s < 2.15 s
  v = EvaluateAuto(o, in);
  EXPECT_FALSE(v.pays_back);
  EXPECT_NE(v.why.find("over 10 iterations"), std::string::npos) << v.why;
  in.iterations_left = 0;
  v = EvaluateAuto(o, in);
  EXPECT_FALSE(v.pays_back);
  EXPECT_NE(v.why.find("run ends"), std::string::npos) << v.why;
}

// A move that pauses the job longer than an iteration waits until the gain
// forgone while confirming has reached its pause (ski rental's break-even);
// a cheap one needs the confirmations only.
TEST(AutoGateTest, ACostlyMoveWaitsUntilTheForgoneGainReachesItsPause) {
  AutoOptions o;
  o.confirmations = 3;
  AutoGate gate(o);
  AutoVerdict costly;
  costly.pays_back = true;
  costly.iteration_s = 8;
  costly.gain_per_iteration_s = 0.8;
  costly.migration_s = 50;  // 62.5 iterations of gain
  for (int it = 100; it < 162; ++it) EXPECT_FALSE(gate.Observe(costly, it)) << it;
  EXPECT_TRUE(gate.Observe(costly, 162));  // 63 iterations x 0.8 s >= 50 s

  AutoGate again(o);
  for (int it = 100; it < 130; ++it) EXPECT_FALSE(again.Observe(costly, it));
  EXPECT_FALSE(again.Observe(AutoVerdict{}, 130));  // the change went away
  for (int it = 131; it < 190; ++it) EXPECT_FALSE(again.Observe(costly, it)) << it;

  // Several evaluations of one iteration forgo its gain once.
  AutoGate repeated(o);
  for (int k = 0; k < 100; ++k) EXPECT_FALSE(repeated.Observe(costly, 100));

  AutoGate cheap_gate(o);
  AutoVerdict cheap = costly;
  cheap.migration_s = 4;  // shorter than an iteration
  EXPECT_FALSE(cheap_gate.Observe(cheap, 1));
  EXPECT_FALSE(cheap_gate.Observe(cheap, 2));
  EXPECT_TRUE(cheap_gate.Observe(cheap, 3));

  AutoGate release_gate(o);
  AutoVerdict release = costly;
  release.releases_gpus = true;  // pays back in GPUs
  EXPECT_FALSE(release_gate.Observe(release, 1));
  EXPECT_FALSE(release_gate.Observe(release, 2));
  EXPECT_TRUE(release_gate.Observe(release, 3));
}

// Noise around a balanced layout: the candidate is sometimes a hair better,
// sometimes worse. The gate must never fire (no thrashing).
TEST(AutoGateTest, NoiseAroundTheOptimumNeverTriggers) {
  AutoOptions o;
  AutoGate gate(o);
  std::mt19937 rng(7);
  std::normal_distribution<double> noise(0, 0.01);
  for (int it = 0; it < 5000; ++it) {
    const double current = 0.1 * (1 + noise(rng));
    const double candidate = 0.1 * (1 + noise(rng));
    AutoVerdict v =
        EvaluateAuto(o, AutoInput{current, candidate, 64LL << 20, 8});
    ASSERT_FALSE(gate.Observe(v, it)) << "fired at iteration " << it;
  }
}

}  // namespace
}  // namespace dynmo::service
