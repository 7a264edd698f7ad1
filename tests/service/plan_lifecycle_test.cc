// PlanLifecycle on its own: a roster of three ranks (three stages, every
// rank attached to a sink of its own), events in, one PlanReady out.
#include "coordinator/job/plan_lifecycle.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dynmo::service {
namespace {

using dynmo::v1::CoordinatorMessage;
using dynmo::v1::PlanAck;
using Persist = PlanReady::Persist;

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

class Sink : public SessionSink {
 public:
  void SendTo(absl::Span<const int> /*ranks*/, std::shared_ptr<const CoordinatorMessage>) override {}
  void Close(const absl::Status&) override {}
};

dynmo::v1::RegisterRequest Reg(int rank) {
  dynmo::v1::RegisterRequest r;
  r.set_job("job");
  r.set_rank(rank);
  r.set_pipeline_rank(rank);
  r.set_pipeline_size(3);
  r.set_data_parallel_size(1);
  r.set_num_layers(6);
  r.set_host("h");
  r.set_microbatches(4);
  return r;
}

dynmo::v1::Plan Plan(int64_t apply_iteration, bool one_phase = false) {
  dynmo::v1::Plan p;
  p.set_job("job");
  p.set_apply_iteration(apply_iteration);
  p.set_commit_with_prepare(one_phase);
  p.add_boundaries(0);
  p.add_boundaries(1);
  p.add_boundaries(5);
  p.add_boundaries(6);
  for (int s = 0; s < 3; ++s) p.add_active_stages(s);
  return p;
}

PlanAck Ack(uint64_t epoch, PlanAck::State state) {
  PlanAck a;
  a.set_epoch(epoch);
  a.set_state(state);
  return a;
}

// The one message kind `ready` sends (to every rank it goes to).
std::string Sent(const PlanReady& ready) {
  std::string kinds;
  for (const JobEffects::Send& s : ready.effects.sends) {
    const CoordinatorMessage& m = *s.message;
    kinds += m.has_prepare() ? "P" : m.has_commit() ? "C" : m.has_abort() ? "A" : "?";
  }
  return kinds;
}

class PlanLifecycleTest : public ::testing::Test {
 protected:
  explicit PlanLifecycleTest(int history_limit = 32)
      : roster_(JobShape{"job", 3, 1, 6, "", 0}),
        layout_(StartingLayout(4, "", {0, 1, 2}, {0, 2, 4, 6}, 3, 6)),
        plans_(PlanLifecycleOptions{"job", absl::Seconds(10), history_limit},
               &roster_, &layout_, /*epoch=*/0) {
    for (int r = 0; r < 3; ++r) {
      roster_.Register(Reg(r));
      sinks_.push_back(std::make_shared<Sink>());
      const int ranks[] = {r};
      roster_.Attach(ranks, sinks_.back());
    }
  }

  RankRoster roster_;
  JobLayout layout_;
  PlanLifecycle plans_;
  std::vector<std::shared_ptr<SessionSink>> sinks_;
};

TEST_F(PlanLifecycleTest, IssueNumbersTheEpochAndSendsThePrepareOnceDurable) {
  PlanReady ready = plans_.Issue(Plan(20), kT0);
  EXPECT_EQ(ready.persist, Persist::kFirst) << "the epoch is durable first";
  EXPECT_EQ(Sent(ready), "PPP");
  EXPECT_EQ(ready.effects.sends[0].message->prepare().epoch(), 1u);
  EXPECT_EQ(ready.effects.plans_issued, 1);
  ASSERT_EQ(ready.effects.events.size(), 1u);
  EXPECT_EQ(ready.effects.events[0].name, "plan_issued");
  EXPECT_EQ(plans_.epoch(), 1u);
  EXPECT_EQ(plans_.applied_epoch(), 0u);
  EXPECT_STREQ(plans_.StateName(), "preparing");
  EXPECT_FALSE(plans_.CheckIdle().ok());
}

TEST_F(PlanLifecycleTest, CommitsOnlyOnceEveryParticipantPrepared) {
  plans_.Issue(Plan(20), kT0);
  EXPECT_EQ(Sent(plans_.OnAck(0, Ack(1, PlanAck::PREPARED), kT0)), "");
  EXPECT_EQ(Sent(plans_.OnAck(0, Ack(1, PlanAck::PREPARED), kT0)), "")
      << "a duplicate PREPARED counts once";
  EXPECT_EQ(Sent(plans_.OnAck(1, Ack(1, PlanAck::PREPARED), kT0)), "");
  PlanReady commit = plans_.OnAck(2, Ack(1, PlanAck::PREPARED), kT0);
  EXPECT_EQ(commit.persist, Persist::kFirst) << "the commit is durable first";
  ASSERT_EQ(Sent(commit), "CCC");
  EXPECT_EQ(commit.effects.sends[0].message->commit().epoch(), 1u);
  EXPECT_EQ(commit.effects.sends[0].message->commit().apply_iteration(), 20);
  EXPECT_STREQ(plans_.StateName(), "committed");
}

TEST_F(PlanLifecycleTest, ARankOfAReleasedStageDoesNotCountTowardsTheCommit) {
  layout_.active_stages = {0, 1};  // stage 2 released
  layout_.boundaries = {0, 3, 6};
  plans_.Issue(Plan(20), kT0);
  EXPECT_EQ(Sent(plans_.OnAck(2, Ack(1, PlanAck::PREPARED), kT0)), "")
      << "a rank that does not participate does not count";
  EXPECT_EQ(Sent(plans_.OnAck(0, Ack(1, PlanAck::PREPARED), kT0)), "");
  EXPECT_EQ(Sent(plans_.OnAck(1, Ack(1, PlanAck::PREPARED), kT0)), "CC");
}

TEST_F(PlanLifecycleTest, LatePreparedAfterTheCommitDrawsTheCommitOnlyToThatRank) {
  plans_.Issue(Plan(20), kT0);
  for (int r = 0; r < 3; ++r) plans_.OnAck(r, Ack(1, PlanAck::PREPARED), kT0);
  PlanReady again = plans_.OnAck(1, Ack(1, PlanAck::PREPARED), kT0);
  ASSERT_EQ(Sent(again), "C");
  EXPECT_EQ(again.effects.sends[0].ranks, std::vector<int>{1});
  EXPECT_EQ(again.persist, Persist::kNo);
}

TEST_F(PlanLifecycleTest, OnePhasePlanIsCommittedAsItLeaves) {
  plans_.Issue(Plan(20, /*one_phase=*/true), kT0);
  EXPECT_STREQ(plans_.StateName(), "committed");
  EXPECT_EQ(Sent(plans_.OnAck(0, Ack(1, PlanAck::PREPARED), kT0)), "");
  const int ranks[] = {0};
  EXPECT_EQ(Sent(plans_.OnAttach(sinks_[0], ranks)), "P") << "the PREPARE is the commit";
}

TEST_F(PlanLifecycleTest, AFailedRankAbortsAndTheAbortIsSentAgainOnReattach) {
  plans_.Issue(Plan(20), kT0);
  PlanReady abort = plans_.OnAck(2, Ack(1, PlanAck::FAILED), kT0);
  ASSERT_EQ(Sent(abort), "AAA");
  EXPECT_EQ(abort.persist, Persist::kSettled);
  EXPECT_EQ(abort.effects.plans_aborted, 1);
  const std::string why = abort.effects.sends[0].message->abort().reason();
  EXPECT_EQ(why, "rank 2 failed: ");
  EXPECT_EQ(plans_.in_flight(), nullptr);
  ASSERT_EQ(plans_.history().size(), 1u);
  EXPECT_EQ(plans_.history().back().outcome(), dynmo::v1::PLAN_OUTCOME_ABORTED);
  const int ranks[] = {0, 2};
  PlanReady missed = plans_.OnAttach(sinks_[0], ranks);
  ASSERT_EQ(Sent(missed), "A");
  EXPECT_EQ(missed.effects.sends[0].ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(missed.effects.sends[0].message->abort().reason(), why);
  EXPECT_EQ(Sent(plans_.OnAck(0, Ack(1, PlanAck::PREPARED), kT0)), "")
      << "acks of a settled epoch are no-ops";
}

TEST_F(PlanLifecycleTest, TimeoutAndApplyIterationAbortAPreparingPlan) {
  plans_.Issue(Plan(20), kT0);
  EXPECT_EQ(Sent(plans_.OnTick(kT0 + absl::Seconds(5), 10)), "");
  EXPECT_EQ(Sent(plans_.OnTick(kT0 + absl::Seconds(11), 10)), "AAA");
  plans_.Issue(Plan(20), kT0);
  PlanReady late = plans_.OnTick(kT0 + absl::Seconds(5), 19);
  ASSERT_EQ(Sent(late), "AAA");
  EXPECT_EQ(late.effects.sends[0].message->abort().reason(),
            "not every rank prepared before iteration 19");
}

TEST_F(PlanLifecycleTest, ReportsBeforeTheApplyIterationLeaveACommittedPlan) {
  plans_.Issue(Plan(20, /*one_phase=*/true), kT0);
  PlanReady before = plans_.OnReport(0, 19, 0, 0.0, kT0);
  EXPECT_EQ(Sent(before), "");
  EXPECT_FALSE(before.applied.has_value());
  EXPECT_STREQ(plans_.StateName(), "committed");
}

TEST_F(PlanLifecycleTest, AReportOfTheApplyIterationUnderTheOldEpochAborts) {
  plans_.Issue(Plan(20, /*one_phase=*/true), kT0);
  EXPECT_EQ(Sent(plans_.OnReport(0, 20, 0, 0.0, kT0)), "AAA");
  EXPECT_EQ(plans_.history().back().outcome(), dynmo::v1::PLAN_OUTCOME_ABORTED);
}

TEST_F(PlanLifecycleTest, AReportOfTheApplyIterationUnderThePlanAppliesIt) {
  plans_.Issue(Plan(20, /*one_phase=*/true), kT0);
  PlanReady applied = plans_.OnReport(0, 20, 1, 0.0, kT0);
  ASSERT_TRUE(applied.applied.has_value());
  EXPECT_EQ(applied.applied->epoch(), 1u);
  EXPECT_EQ(applied.persist, Persist::kSettled);
  EXPECT_EQ(applied.effects.plans_applied, 1);
  EXPECT_EQ(Sent(applied), "") << "nothing to send: the ranks switched";
  EXPECT_EQ(plans_.applied_epoch(), 1u);
  EXPECT_TRUE(plans_.CheckIdle().ok());
}

TEST_F(PlanLifecycleTest, ARankBackWithOrWithoutTheCommittedPlanSettlesIt) {
  plans_.Issue(Plan(20, /*one_phase=*/true), kT0);
  dynmo::v1::RegisterRequest back = Reg(0);
  back.set_pending_epoch(1);
  EXPECT_EQ(Sent(plans_.OnRegistered(back, kT0)), "") << "still holds it";
  back.set_pending_epoch(0);
  EXPECT_EQ(Sent(plans_.OnRegistered(back, kT0)), "AAA") << "lost it";

  plans_.Issue(Plan(20, /*one_phase=*/true), kT0);
  back.set_applied_epoch(2);
  EXPECT_TRUE(plans_.OnRegistered(back, kT0).applied.has_value()) << "applied it";
  EXPECT_EQ(plans_.applied_epoch(), 2u);
}

TEST_F(PlanLifecycleTest, AcksAndReportsOfEpochsNeverIssuedAreRefused) {
  EXPECT_EQ(plans_.CheckAck(0, Ack(1, PlanAck::PREPARED)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plans_.CheckReportEpoch(1).code(), absl::StatusCode::kInvalidArgument);
  plans_.Issue(Plan(20), kT0);
  EXPECT_TRUE(plans_.CheckReportEpoch(1).ok());
  EXPECT_EQ(plans_.CheckAck(0, Ack(1, PlanAck::APPLIED)).code(),
            absl::StatusCode::kFailedPrecondition)
      << "applied before the commit";
  EXPECT_TRUE(plans_.CheckAck(0, Ack(1, PlanAck::PREPARED)).ok());
}

TEST_F(PlanLifecycleTest, AnIssueThatCouldNotBeMadeDurableIsUndone) {
  plans_.Issue(Plan(20), kT0);
  PlanReady undone = plans_.Undurable(absl::UnavailableError("disk full"), kT0);
  EXPECT_EQ(Sent(undone), "");
  EXPECT_EQ(undone.persist, Persist::kNo);
  EXPECT_EQ(plans_.epoch(), 0u);
  EXPECT_EQ(plans_.in_flight(), nullptr);
  EXPECT_TRUE(plans_.history().empty());
  EXPECT_EQ(plans_.Issue(Plan(20), kT0).effects.sends[0].message->prepare().epoch(), 1u);
}

TEST_F(PlanLifecycleTest, ACommitThatCouldNotBeMadeDurableBecomesAnAbort) {
  plans_.Issue(Plan(20), kT0);
  for (int r = 0; r < 3; ++r) plans_.OnAck(r, Ack(1, PlanAck::PREPARED), kT0);
  PlanReady abort = plans_.Undurable(absl::UnavailableError("disk full"), kT0);
  ASSERT_EQ(Sent(abort), "AAA");
  EXPECT_EQ(abort.effects.sends[0].message->abort().reason(),
            "cannot persist the commit: disk full");
  EXPECT_EQ(plans_.history().back().outcome(), dynmo::v1::PLAN_OUTCOME_ABORTED);
}

TEST_F(PlanLifecycleTest, ARankUnderANewerEpochIsAdoptedWithItsPlansLayout) {
  plans_.Issue(Plan(20), kT0);
  plans_.OnAck(0, Ack(1, PlanAck::FAILED), kT0);  // aborted, yet the ranks switched
  PlanReady adopted = plans_.OnReport(1, 21, 1, 0.0, kT0);
  ASSERT_TRUE(adopted.applied.has_value());
  EXPECT_EQ(adopted.applied->boundaries(1), 1);
  EXPECT_EQ(plans_.applied_epoch(), 1u);
  EXPECT_EQ(plans_.history().back().outcome(), dynmo::v1::PLAN_OUTCOME_APPLIED);
  ASSERT_FALSE(adopted.effects.events.empty());
  EXPECT_EQ(adopted.effects.events.back().name, "epoch_adopted");
}

TEST_F(PlanLifecycleTest, ARegistrationBeyondEveryIssuedEpochIsAdoptedAndLogged) {
  dynmo::v1::RegisterRequest r = Reg(0);
  r.set_applied_epoch(7);
  for (int b : {0, 3, 5, 6}) r.add_boundaries(b);
  for (int s : {0, 1, 2}) r.add_active_stages(s);
  PlanReady adopted = plans_.OnRegistering(r, kT0);
  EXPECT_TRUE(adopted.epoch_adopted);
  EXPECT_EQ(adopted.rank_layout, &r);
  EXPECT_EQ(plans_.epoch(), 7u);
  EXPECT_EQ(plans_.applied_epoch(), 7u);
  ASSERT_EQ(adopted.effects.events.size(), 1u);
  EXPECT_EQ(adopted.effects.events[0].name, "epoch_adopted") << "never silently";
}

TEST_F(PlanLifecycleTest, AnAppliedPlanIsFollowedToItsRealizedGain) {
  dynmo::v1::Plan plan = Plan(20, /*one_phase=*/true);
  plan.set_previous_bottleneck_s(2.0);
  plan.set_predicted_bottleneck_s(1.6);
  PlanReady issued = plans_.Issue(plan, kT0);
  EXPECT_NEAR(plans_.in_flight()->predicted_gain(), 0.25, 1e-12);
  // Every rank's step time: 2.0 s before the switch, 1.6 s after it, the
  // migration's iterations slow.
  auto report_all = [&](int64_t i, uint64_t epoch, double s) {
    PlanReady all;
    for (int r = 0; r < 3; ++r) all.Merge(plans_.OnReport(r, i, epoch, s, kT0));
    return all;
  };
  for (int64_t i = 8; i < 20; ++i) report_all(i, 0, i == 19 ? 5.0 : 2.0);
  EXPECT_TRUE(report_all(20, 1, 7.0).applied.has_value());
  for (int64_t i = 21; i < 29; ++i) {
    PlanReady r = report_all(i, 1, i == 21 ? 3.0 : i == 23 ? 1.7 : i == 25 ? 1.5 : 1.6);
    EXPECT_TRUE(r.effects.gains.empty()) << "the window after is not complete at " << i;
  }
  PlanReady realized = report_all(29, 1, 1.6);
  ASSERT_EQ(realized.effects.gains.size(), 1u);
  EXPECT_EQ(realized.effects.gains[0].epoch, 1u);
  EXPECT_NEAR(realized.effects.gains[0].predicted, 0.25, 1e-12);
  EXPECT_NEAR(realized.effects.gains[0].realized, 2.0 / 1.6 - 1, 1e-12);
  EXPECT_EQ(realized.persist, Persist::kSettled);
  ASSERT_EQ(realized.effects.events.size(), 1u);
  EXPECT_EQ(realized.effects.events[0].name, "plan_realized");
  const dynmo::v1::PlanRecord& h = plans_.history().back();
  EXPECT_DOUBLE_EQ(h.realized_before_s(), 2.0);
  EXPECT_DOUBLE_EQ(h.realized_after_s(), 1.6);
  EXPECT_EQ(h.realized_samples(), 8);
  EXPECT_DOUBLE_EQ(h.realized_spread(), 0.0) << "one step in four off: the median ignores it";
  ASSERT_EQ(plans_.predictions().size(), 1);
  EXPECT_NEAR(*plans_.predictions().MedianShortfall(), 0.0, 1e-12)
      << "it delivered what it promised";
  EXPECT_TRUE(report_all(30, 1, 1.6).effects.gains.empty()) << "measured once";

  // The record survives a restart: the gate calibrates from it at once.
  dynmo::v1::JobRecord record;
  plans_.ToRecord(&record);
  PlanLifecycle restored(PlanLifecycleOptions{"job"}, &roster_, &layout_, 0);
  restored.Restore(record, kT0);
  EXPECT_EQ(restored.predictions().size(), 1);
}

class ShortHistoryTest : public PlanLifecycleTest {
 protected:
  ShortHistoryTest() : PlanLifecycleTest(/*history_limit=*/2) {}
};

TEST_F(ShortHistoryTest, HistoryKeepsTheNewestSettledPlans) {
  for (int i = 0; i < 5; ++i) {
    plans_.Issue(Plan(20), kT0);
    plans_.OnAck(0, Ack(static_cast<uint64_t>(i + 1), PlanAck::FAILED), kT0);
  }
  ASSERT_EQ(plans_.history().size(), 2u);
  EXPECT_EQ(plans_.history().front().plan().epoch(), 4u);
  EXPECT_EQ(plans_.history().back().plan().epoch(), 5u);
}

TEST_F(PlanLifecycleTest, RestoreAbortsAPreparingPlanAndKeepsACommittedOne) {
  plans_.Issue(Plan(20), kT0);
  dynmo::v1::JobRecord record;
  plans_.ToRecord(&record);

  PlanLifecycle restored(PlanLifecycleOptions{"job"}, &roster_, &layout_, 0);
  EXPECT_TRUE(restored.Restore(record, kT0));
  EXPECT_EQ(restored.epoch(), 1u);
  EXPECT_EQ(restored.in_flight(), nullptr);
  ASSERT_EQ(restored.history().size(), 1u);
  EXPECT_EQ(restored.history().back().outcome(), dynmo::v1::PLAN_OUTCOME_ABORTED);

  for (int r = 0; r < 3; ++r) plans_.OnAck(r, Ack(1, PlanAck::PREPARED), kT0);
  dynmo::v1::JobRecord committed;
  plans_.ToRecord(&committed);
  PlanLifecycle kept(PlanLifecycleOptions{"job"}, &roster_, &layout_, 0);
  EXPECT_FALSE(kept.Restore(committed, kT0));
  ASSERT_NE(kept.in_flight(), nullptr);
  EXPECT_STREQ(kept.StateName(), "committed");
}

}  // namespace
}  // namespace dynmo::service
