// RankState, the per-rank protocol state a HostAgent keeps for each hosted
// rank: the same rules as Agent's (tests/agent/agent_protocol_test.cc),
// checked without any transport.
#include "agent/rank_state.h"

#include "gtest/gtest.h"

namespace dynmo::agent {
namespace {

using dynmo::v1::CoordinatorMessage;
using dynmo::v1::PlanAck;

AgentConfig Config() {
  AgentConfig c;
  c.job = "job";
  c.rank = 1;
  c.pipeline_rank = 1;
  c.pipeline_size = 2;
  c.num_layers = 4;
  c.queue_capacity = 2;
  return c;
}

CoordinatorMessage Prepare(uint64_t epoch, int64_t apply, bool one_phase = false) {
  CoordinatorMessage m;
  m.mutable_prepare()->set_job("job");
  m.mutable_prepare()->set_epoch(epoch);
  m.mutable_prepare()->set_apply_iteration(apply);
  for (int b : {0, 1, 4}) m.mutable_prepare()->add_boundaries(b);
  for (int s : {0, 1}) m.mutable_prepare()->add_active_stages(s);
  m.mutable_prepare()->set_commit_with_prepare(one_phase);
  return m;
}

CoordinatorMessage Commit(uint64_t epoch) {
  CoordinatorMessage m;
  m.mutable_commit()->set_epoch(epoch);
  return m;
}

std::vector<PlanAck::State> TakeAcks(RankState& r) {
  std::vector<PlanAck::State> out;
  while (!r.acks().empty()) {
    out.push_back(r.acks().front().state());
    r.acks().pop_front();
    r.AckWritten();
  }
  return out;
}

TEST(RankStateTest, CommittedPlanIsDueOnlyAtItsApplyIterationAndAppliedOnce) {
  RankState r(Config());
  r.HandleDown(Prepare(3, 5));
  EXPECT_EQ(TakeAcks(r), std::vector<PlanAck::State>{PlanAck::PREPARED});
  r.HandleDown(Commit(3));
  EXPECT_FALSE(r.DueAt(4).has_value());
  auto plan = r.DueAt(5);
  ASSERT_TRUE(plan.has_value());
  ASSERT_TRUE(r.Acknowledge(3, true, "").ok());
  EXPECT_EQ(TakeAcks(r), std::vector<PlanAck::State>{PlanAck::APPLIED});
  EXPECT_EQ(r.Stats(true).applied_epoch, 3u);
  EXPECT_EQ(r.Stats(true).boundaries, (std::vector<int>{0, 1, 4}));
  EXPECT_EQ(r.Acknowledge(3, true, "").code(),
            absl::StatusCode::kFailedPrecondition);
  // A duplicate PREPARE of the settled epoch repeats the verdict only.
  r.HandleDown(Prepare(3, 5));
  EXPECT_EQ(TakeAcks(r), std::vector<PlanAck::State>{PlanAck::APPLIED});
  EXPECT_FALSE(r.DueAt(5).has_value());
  EXPECT_EQ(r.MakeRegisterRequest().applied_epoch(), 3u);
}

TEST(RankStateTest, UncommittedPlanIsFailedAtItsApplyIterationAndALateCommitIsIgnored) {
  RankState r(Config());
  r.HandleDown(Prepare(2, 5));
  EXPECT_EQ(r.MakeRegisterRequest().pending_epoch(), 2u);
  TakeAcks(r);
  EXPECT_FALSE(r.DueAt(5).has_value());
  EXPECT_EQ(TakeAcks(r), std::vector<PlanAck::State>{PlanAck::FAILED});
  r.HandleDown(Commit(2));
  EXPECT_FALSE(r.DueAt(5).has_value());
  EXPECT_EQ(r.Stats(true).applied_epoch, 0u);
}

TEST(RankStateTest, TooLateStaleAndAbortedPlansAreNeverApplied) {
  RankState r(Config());
  IterationSample s;
  s.iteration = 7;
  ASSERT_TRUE(r.Report(s).ok());
  r.HandleDown(Prepare(4, 7));  // iteration 7 already ran
  EXPECT_EQ(TakeAcks(r), std::vector<PlanAck::State>{PlanAck::FAILED});
  r.HandleDown(Prepare(6, 12, /*one_phase=*/true));
  EXPECT_EQ(TakeAcks(r), std::vector<PlanAck::State>{PlanAck::PREPARED});
  EXPECT_TRUE(r.LatestCommitted().has_value()) << "one-phase: committed";
  r.HandleDown(Prepare(5, 12));  // older than the one held
  EXPECT_TRUE(TakeAcks(r).empty());
  CoordinatorMessage abort;
  abort.mutable_abort()->set_epoch(6);
  r.HandleDown(abort);
  EXPECT_FALSE(r.DueAt(12).has_value());
  EXPECT_FALSE(r.LatestCommitted().has_value());
}

TEST(RankStateTest, ReportsAreValidatedAndTheOldestDroppedWhenFull) {
  RankState r(Config());
  IterationSample bad;
  core::LayerCost c;
  c.id = 4;  // outside the 4 layers
  bad.layers.push_back(c);
  EXPECT_EQ(r.Report(bad).code(), absl::StatusCode::kInvalidArgument);
  for (int k = 0; k < 5; ++k) {
    IterationSample s;
    s.iteration = k;
    ASSERT_TRUE(r.Report(s).ok());
  }
  ASSERT_EQ(r.reports().size(), 2u);
  EXPECT_EQ(r.reports().front().iteration(), 3);
  EXPECT_EQ(r.Stats(false).samples_dropped, 3);
}

}  // namespace
}  // namespace dynmo::agent

namespace dynmo::agent {
namespace {

TEST(RankStateTest, AnAppliedReshapeGivesTheRankItsNewCoordinates) {
  // Rank 1 of a 2 x 1 job, 8 micro-batches; the plan makes it 1 x 2.
  AgentConfig c = Config();
  c.microbatches = 8;
  RankState r(c);
  CoordinatorMessage m = Prepare(2, 5, /*one_phase=*/true);
  m.mutable_prepare()->clear_active_stages();
  m.mutable_prepare()->clear_boundaries();
  m.mutable_prepare()->add_active_stages(0);
  for (int b : {0, 4}) m.mutable_prepare()->add_boundaries(b);
  m.mutable_prepare()->mutable_reshape()->set_pipeline_size(1);
  m.mutable_prepare()->mutable_reshape()->set_data_parallel_size(2);
  r.HandleDown(m);
  ASSERT_TRUE(r.DueAt(5).has_value());
  ASSERT_TRUE(r.Acknowledge(2, true, "").ok());
  const dynmo::v1::RegisterRequest reg = r.MakeRegisterRequest();
  EXPECT_EQ(reg.pipeline_size(), 1);
  EXPECT_EQ(reg.data_parallel_size(), 2);
  EXPECT_EQ(reg.pipeline_rank(), 0);
  EXPECT_EQ(reg.data_parallel_rank(), 1);
  EXPECT_EQ(reg.microbatches(), 4);
  EXPECT_EQ(reg.active_stages_size(), 0);  // every stage of the new grid
  EXPECT_FALSE(r.Stats(true).released);
}

}  // namespace
}  // namespace dynmo::agent
