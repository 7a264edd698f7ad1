#include "coordinator/job/plan_protocol.h"

#include <string>

#include "gtest/gtest.h"

namespace dynmo::service {
namespace {

using dynmo::v1::CoordinatorMessage;
using dynmo::v1::PlanAck;
using Kind = PlanStep::Kind;

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

PlanProtocol Protocol(int history_limit = 32) {
  return PlanProtocol(PlanProtocolOptions{"job", absl::Seconds(10), history_limit},
                      /*num_ranks=*/3, /*epoch=*/0);
}

dynmo::v1::Plan Plan(int64_t apply_iteration, bool one_phase = false) {
  dynmo::v1::Plan p;
  p.set_job("job");
  p.set_apply_iteration(apply_iteration);
  p.set_commit_with_prepare(one_phase);
  return p;
}

PlanAck Ack(uint64_t epoch, PlanAck::State state) {
  PlanAck a;
  a.set_epoch(epoch);
  a.set_state(state);
  return a;
}

TEST(PlanProtocolTest, IssueNumbersTheEpochAndReturnsThePrepare) {
  PlanProtocol p = Protocol();
  CoordinatorMessage m = p.Issue(Plan(20), 3, kT0);
  ASSERT_TRUE(m.has_prepare());
  EXPECT_EQ(m.prepare().epoch(), 1u);
  EXPECT_EQ(p.epoch(), 1u);
  EXPECT_EQ(p.applied_epoch(), 0u);
  EXPECT_STREQ(p.StateName(), "preparing");
  EXPECT_FALSE(p.CheckIdle().ok());
}

TEST(PlanProtocolTest, CommitsOnlyOnceEveryParticipantPrepared) {
  PlanProtocol p = Protocol();
  p.Issue(Plan(20), 3, kT0);
  EXPECT_EQ(p.OnAck(0, true, Ack(1, PlanAck::PREPARED)).kind, Kind::kNone);
  EXPECT_EQ(p.OnAck(0, true, Ack(1, PlanAck::PREPARED)).kind, Kind::kNone)
      << "a duplicate PREPARED counts once";
  EXPECT_EQ(p.OnAck(1, false, Ack(1, PlanAck::PREPARED)).kind, Kind::kNone)
      << "a rank that does not participate does not count";
  EXPECT_EQ(p.OnAck(1, true, Ack(1, PlanAck::PREPARED)).kind, Kind::kNone);
  EXPECT_EQ(p.OnAck(2, true, Ack(1, PlanAck::PREPARED)).kind, Kind::kCommit);
  CoordinatorMessage c = p.Commit(kT0);
  ASSERT_TRUE(c.has_commit());
  EXPECT_EQ(c.commit().epoch(), 1u);
  EXPECT_EQ(c.commit().apply_iteration(), 20);
  EXPECT_STREQ(p.StateName(), "committed");
}

TEST(PlanProtocolTest, LatePreparedAfterTheCommitAsksForTheCommitOnly) {
  PlanProtocol p = Protocol();
  p.Issue(Plan(20), 1, kT0);
  ASSERT_EQ(p.OnAck(0, true, Ack(1, PlanAck::PREPARED)).kind, Kind::kCommit);
  p.Commit(kT0);
  EXPECT_EQ(p.OnAck(1, true, Ack(1, PlanAck::PREPARED)).kind, Kind::kResendCommit);
}

TEST(PlanProtocolTest, OnePhasePlanIsCommittedAsItLeaves) {
  PlanProtocol p = Protocol();
  p.Issue(Plan(20, /*one_phase=*/true), 3, kT0);
  EXPECT_STREQ(p.StateName(), "committed");
  EXPECT_EQ(p.OnAck(0, true, Ack(1, PlanAck::PREPARED)).kind, Kind::kNone);
  PlanProtocol::Missed missed = p.MissedMessages();
  ASSERT_EQ(missed.messages.size(), 1u) << "the PREPARE is the commit";
  EXPECT_TRUE(missed.messages[0].has_prepare());
}

TEST(PlanProtocolTest, AFailedRankAbortsAndTheAbortIsSentAgainOnReattach) {
  PlanProtocol p = Protocol();
  p.Issue(Plan(20), 3, kT0);
  PlanStep step = p.OnAck(2, true, Ack(1, PlanAck::FAILED));
  ASSERT_EQ(step.kind, Kind::kAbort);
  CoordinatorMessage m = p.Abort(step.why, kT0);
  ASSERT_TRUE(m.has_abort());
  EXPECT_EQ(m.abort().epoch(), 1u);
  EXPECT_EQ(p.in_flight(), nullptr);
  ASSERT_EQ(p.history().size(), 1u);
  EXPECT_EQ(p.history().back().outcome(), dynmo::v1::PLAN_OUTCOME_ABORTED);
  PlanProtocol::Missed missed = p.MissedMessages();
  EXPECT_FALSE(missed.active_ranks_only);
  ASSERT_EQ(missed.messages.size(), 1u);
  EXPECT_EQ(missed.messages[0].abort().reason(), step.why);
  EXPECT_EQ(p.OnAck(0, true, Ack(1, PlanAck::PREPARED)).kind, Kind::kNone)
      << "acks of a settled epoch are no-ops";
}

TEST(PlanProtocolTest, TimeoutAndApplyIterationAbortAPreparingPlan) {
  PlanProtocol p = Protocol();
  p.Issue(Plan(20), 3, kT0);
  EXPECT_EQ(p.OnTick(kT0 + absl::Seconds(5), 10).kind, Kind::kNone);
  EXPECT_EQ(p.OnTick(kT0 + absl::Seconds(11), 10).kind, Kind::kAbort);
  PlanStep late = p.OnTick(kT0 + absl::Seconds(5), 19);
  EXPECT_EQ(late.kind, Kind::kAbort);
  EXPECT_EQ(late.why, "not every rank prepared before iteration 19");
}

TEST(PlanProtocolTest, ReportsOfTheApplyIterationSettleACommittedPlan) {
  PlanProtocol p = Protocol();
  p.Issue(Plan(20, /*one_phase=*/true), 3, kT0);
  EXPECT_EQ(p.OnReport(0, 19, 0).kind, Kind::kNone);
  EXPECT_EQ(p.OnReport(0, 20, 0).kind, Kind::kAbort);
  PlanStep applied = p.OnReport(0, 20, 1);
  ASSERT_EQ(applied.kind, Kind::kApply);
  dynmo::v1::Plan plan = p.Apply(applied.why, kT0);
  EXPECT_EQ(plan.epoch(), 1u);
  EXPECT_EQ(p.applied_epoch(), 1u);
  EXPECT_TRUE(p.CheckIdle().ok());
}

TEST(PlanProtocolTest, ARankBackWithOrWithoutTheCommittedPlanSettlesIt) {
  PlanProtocol p = Protocol();
  p.Issue(Plan(20, /*one_phase=*/true), 3, kT0);
  EXPECT_EQ(p.OnRegister(0, 0, /*pending=*/1).kind, Kind::kNone);
  EXPECT_EQ(p.OnRegister(0, 0, /*pending=*/0).kind, Kind::kAbort);
  EXPECT_EQ(p.OnRegister(0, /*applied=*/1, 0).kind, Kind::kApply);
}

TEST(PlanProtocolTest, AcksAndReportsOfEpochsNeverIssuedAreRefused) {
  PlanProtocol p = Protocol();
  EXPECT_EQ(p.CheckAck(0, Ack(1, PlanAck::PREPARED)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.CheckReportEpoch(1).code(), absl::StatusCode::kInvalidArgument);
  p.Issue(Plan(20), 3, kT0);
  EXPECT_TRUE(p.CheckReportEpoch(1).ok());
  EXPECT_EQ(p.CheckAck(0, Ack(1, PlanAck::APPLIED)).code(),
            absl::StatusCode::kFailedPrecondition)
      << "applied before the commit";
  EXPECT_TRUE(p.CheckAck(0, Ack(1, PlanAck::PREPARED)).ok());
}

TEST(PlanProtocolTest, RetractUndoesAnIssueThatCouldNotBePersisted) {
  PlanProtocol p = Protocol();
  p.Issue(Plan(20), 3, kT0);
  p.Retract();
  EXPECT_EQ(p.epoch(), 0u);
  EXPECT_EQ(p.in_flight(), nullptr);
  EXPECT_EQ(p.Issue(Plan(20), 3, kT0).prepare().epoch(), 1u);
}

TEST(PlanProtocolTest, HistoryKeepsTheNewestSettledPlans) {
  PlanProtocol p = Protocol(/*history_limit=*/2);
  for (int i = 0; i < 5; ++i) {
    p.Issue(Plan(20), 3, kT0);
    p.Abort("test", kT0);
  }
  ASSERT_EQ(p.history().size(), 2u);
  EXPECT_EQ(p.history().front().plan().epoch(), 4u);
  EXPECT_EQ(p.history().back().plan().epoch(), 5u);
}

TEST(PlanProtocolTest, RestoreAbortsAPreparingPlanAndKeepsACommittedOne) {
  PlanProtocol issued = Protocol();
  issued.Issue(Plan(20), 3, kT0);
  dynmo::v1::JobRecord record;
  issued.ToRecord(&record);

  PlanProtocol restored = Protocol();
  EXPECT_TRUE(restored.Restore(record, kT0));
  EXPECT_EQ(restored.epoch(), 1u);
  EXPECT_EQ(restored.in_flight(), nullptr);
  ASSERT_EQ(restored.history().size(), 1u);
  EXPECT_EQ(restored.history().back().outcome(), dynmo::v1::PLAN_OUTCOME_ABORTED);

  issued.Commit(kT0);
  dynmo::v1::JobRecord committed;
  issued.ToRecord(&committed);
  PlanProtocol kept = Protocol();
  EXPECT_FALSE(kept.Restore(committed, kT0));
  ASSERT_NE(kept.in_flight(), nullptr);
  EXPECT_STREQ(kept.StateName(), "committed");
}

}  // namespace
}  // namespace dynmo::service
