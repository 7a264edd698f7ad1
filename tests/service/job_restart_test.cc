// A job restored from the state dir after a coordinator restart is
// reconciled with what its ranks report: the summary shows the saved
// iteration and measures at once, a plan left committed is settled by the
// ranks' epochs, and an epoch the ranks applied that the coordinator had
// settled otherwise is adopted with its layout.
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "coordinator/service/event_log.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/service/job_state_fixture.h"

namespace dynmo::service {
namespace {

class JobRestartTest : public JobStateTest {
 protected:
  // The coordinator restarts over the same state dir: a new keeper reads
  // what the old one committed, and the job is rebuilt from its record.
  JobState& Restart(const JobOptions& options) {
    restored_.reset();
    pool2_.reset();
    keeper2_ = std::make_unique<StateKeeper>(dir_);
    absl::StatusOr<dynmo::v1::CoordinatorState> state = keeper2_->Open();
    EXPECT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(state->jobs_size(), 1);
    pool2_ = std::make_unique<ReleasedPool>(keeper2_.get());
    restored_ = std::make_unique<JobState>(state->jobs(0), options,
                                           JobDeps{keeper2_.get(), pool2_.get(), nullptr});
    return *restored_;
  }
  JobState& Restart() { return Restart(options_); }

  // A plan every rank prepared: COMMITTED, durable.
  dynmo::v1::Plan Committed() {
    const auto plan = Issue();
    for (int r = 0; r < kStages; ++r) {
      EXPECT_TRUE(job_->OnAck(r, Ack(plan.epoch(), PlanAck::PREPARED)).ok());
    }
    EXPECT_EQ(job_->Summary().plan_state(), "committed");
    return plan;
  }

  static std::vector<int> Boundaries(const JobState& job) {
    const auto st = job.Status();
    return {st.boundaries().begin(), st.boundaries().end()};
  }
  static std::vector<int> Boundaries(const dynmo::v1::Plan& plan) {
    return {plan.boundaries().begin(), plan.boundaries().end()};
  }

  std::unique_ptr<StateKeeper> keeper2_;
  std::unique_ptr<ReleasedPool> pool2_;
  std::unique_ptr<JobState> restored_;
};

TEST_F(JobRestartTest, TheSummaryShowsTheSavedIterationAndMeasuresAtOnce) {
  ReportAll(40);
  auto reb = job_->Rebalance(absl::Now());  // measures, issues, persists
  ASSERT_TRUE(reb.ok() && reb->issued()) << reb.status();
  const dynmo::v1::JobSummary before = job_->Summary();
  ASSERT_GT(before.imbalance(), 0);
  JobState& job = Restart();
  const dynmo::v1::JobSummary after = job.Summary();
  EXPECT_EQ(after.last_iteration(), 40) << "not -1 until the first report";
  EXPECT_DOUBLE_EQ(after.imbalance(), before.imbalance());
  EXPECT_DOUBLE_EQ(after.bottleneck_s(), before.bottleneck_s());
  EXPECT_EQ(after.reports(), before.reports());
  EXPECT_EQ(job.Status().stage_load_s_size(), kStages);
  // The ranks went back to a checkpoint: their first report replaces the
  // saved iteration instead of staying below it.
  ASSERT_TRUE(job.OnReport(0, Report(0, 12)).ok());
  EXPECT_EQ(job.Summary().last_iteration(), 12);
  ASSERT_TRUE(job.OnReport(1, Report(1, 13)).ok());
  EXPECT_EQ(job.Summary().last_iteration(), 13);
}

TEST_F(JobRestartTest, TheFirstReportAfterARestartIsNotHeldToTheSavedIteration) {
  ReportAll(40);
  ASSERT_TRUE(job_->Rebalance(absl::Now()).ok());
  JobState& job = Restart();
  // Training went on while the coordinator was down: the window is
  // measured from what this coordinator has heard, not the saved value.
  ASSERT_TRUE(job.OnReport(0, Report(0, 40 + 2'000'000)).ok());
  EXPECT_EQ(job.OnReport(1, Report(1, 40 + 4'000'000)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(JobRestartTest, ACommittedPlanIsAppliedByARankReRegisteringWithIt) {
  const auto plan = Committed();
  JobState& job = Restart();
  EXPECT_EQ(job.Summary().plan_state(), "committed");
  dynmo::v1::RegisterRequest again = Reg(1);
  again.set_applied_epoch(plan.epoch());
  dynmo::v1::RegisterResponse response;
  ASSERT_TRUE(job.Register(again, &response).ok());
  EXPECT_EQ(job.Summary().plan_state(), "idle");
  EXPECT_EQ(job.Summary().applied_epoch(), plan.epoch());
  EXPECT_EQ(Boundaries(job), Boundaries(plan));
  EXPECT_EQ(job.Status().history(0).outcome(), dynmo::v1::PLAN_OUTCOME_APPLIED);
  // And durably so: another restart agrees.
  EXPECT_EQ(Restart().Summary().applied_epoch(), plan.epoch());
}

TEST_F(JobRestartTest, ACommittedPlanIsAppliedByTheFirstReportUnderIt) {
  const auto plan = Committed();
  JobState& job = Restart();
  ASSERT_TRUE(job.OnReport(3, Report(3, plan.apply_iteration(), plan.epoch())).ok());
  EXPECT_EQ(job.Summary().plan_state(), "idle");
  EXPECT_EQ(job.Summary().applied_epoch(), plan.epoch());
  EXPECT_EQ(Boundaries(job), Boundaries(plan));
}

TEST_F(JobRestartTest, ACommittedPlanTheRanksDidNotTakeIsAbortedNotKeptForever) {
  const auto plan = Committed();
  JobState& job = Restart();
  // A rank ran the apply iteration under the old epoch: nobody switched.
  ASSERT_TRUE(job.OnReport(0, Report(0, plan.apply_iteration(), 0)).ok());
  EXPECT_EQ(job.Summary().plan_state(), "idle");
  EXPECT_EQ(job.Summary().applied_epoch(), 0u);
  EXPECT_EQ(job.Status().history(0).outcome(), dynmo::v1::PLAN_OUTCOME_ABORTED);
}

TEST_F(JobRestartTest, APreparingPlanIsAbortedAtTheRestart) {
  Issue();
  EXPECT_EQ(Restart().Summary().plan_state(), "idle");
  EXPECT_EQ(restored_->Status().history(0).outcome(), dynmo::v1::PLAN_OUTCOME_ABORTED);
}

TEST_F(JobRestartTest, AnEpochTheRanksAppliedIsAdoptedWithThePlansLayout) {
  std::ostringstream log;
  ConfigureEventLog(EventLogOptions{LogFormat::kLogfmt, LogLevel::kInfo, &log});
  const auto plan = Committed();
  // The coordinator settles the plan otherwise than the ranks did (here: a
  // rank that re-registered without it), then restarts.
  dynmo::v1::RegisterResponse response;
  ASSERT_TRUE(job_->Register(Reg(2), &response).ok());
  ASSERT_EQ(job_->Status().history(0).outcome(), dynmo::v1::PLAN_OUTCOME_ABORTED);
  JobState& job = Restart();
  EXPECT_EQ(job.Summary().applied_epoch(), 0u);
  // The ranks run under the plan's epoch: the coordinator follows them.
  ASSERT_TRUE(job.OnReport(0, Report(0, plan.apply_iteration() + 1, plan.epoch())).ok());
  ConfigureEventLog(EventLogOptions{});
  EXPECT_EQ(job.Summary().applied_epoch(), plan.epoch());
  EXPECT_EQ(Boundaries(job), Boundaries(plan));
  EXPECT_EQ(job.Status().history(0).outcome(), dynmo::v1::PLAN_OUTCOME_APPLIED);
  EXPECT_NE(log.str().find("event=epoch_adopted job=job rank=0 epoch=1 recorded_epoch=0"),
            std::string::npos)
      << log.str();
  EXPECT_EQ(Restart().Summary().applied_epoch(), plan.epoch()) << "adopted durably";
}

TEST_F(JobRestartTest, WithoutThePlansRecordTheRegisteringRanksLayoutIsAdopted) {
  const auto plan = Committed();
  dynmo::v1::RegisterResponse response;
  ASSERT_TRUE(job_->Register(Reg(2), &response).ok());  // aborts it
  JobOptions forgetful = options_;
  forgetful.history_limit = 0;  // the record of the plan is gone
  JobState& job = Restart(forgetful);
  ASSERT_EQ(job.Status().history_size(), 0);
  dynmo::v1::RegisterRequest again = Reg(1);
  again.set_applied_epoch(plan.epoch());
  for (int b : plan.boundaries()) again.add_boundaries(b);
  for (int s : plan.active_stages()) again.add_active_stages(s);
  ASSERT_TRUE(job.Register(again, &response).ok());
  EXPECT_EQ(job.Summary().applied_epoch(), plan.epoch());
  EXPECT_EQ(Boundaries(job), Boundaries(plan));
  EXPECT_EQ(response.applied_epoch(), plan.epoch());
}

// The job restarts from a checkpoint saved before its last plan (issue
// 41): its ranks run the split they loaded, and the coordinator, whose
// state dir outlived them, follows with an event instead of planning from
// a layout nobody runs.
TEST_F(JobRestartTest, ARankBackFromACheckpointBeforeTheAppliedPlanHasItsLayoutAdopted) {
  std::ostringstream log;
  ConfigureEventLog(EventLogOptions{LogFormat::kLogfmt, LogLevel::kInfo, &log});
  const auto plan = Committed();
  ASSERT_TRUE(job_->OnReport(0, Report(0, plan.apply_iteration(), plan.epoch())).ok());
  ASSERT_EQ(job_->Summary().applied_epoch(), plan.epoch());
  const std::vector<int> saved = {0, 2, 4, 6, 8};
  ASSERT_NE(Boundaries(plan), saved);
  JobState& job = Restart();
  dynmo::v1::RegisterRequest back = Reg(0);  // epochs 0: a new process
  for (int b : saved) back.add_boundaries(b);
  dynmo::v1::RegisterResponse response;
  ASSERT_TRUE(job.Register(back, &response).ok());
  ConfigureEventLog(EventLogOptions{});
  EXPECT_EQ(Boundaries(job), saved);
  EXPECT_EQ(job.Summary().epoch(), plan.epoch()) << "epochs never go back";
  EXPECT_NE(log.str().find("event=layout_adopted job=job rank=0 epoch=0 recorded_epoch=1 "
                           "boundaries_from=" +
                           absl::StrJoin(plan.boundaries(), ",") + " boundaries_to=0,2,4,6,8"),
            std::string::npos)
      << log.str();
  // The other ranks, back from the same checkpoint, change nothing more.
  for (int r = 1; r < kStages; ++r) {
    dynmo::v1::RegisterRequest same = Reg(r);
    for (int b : saved) same.add_boundaries(b);
    ASSERT_TRUE(job.Register(same, &response).ok());
  }
  EXPECT_EQ(Boundaries(job), saved);
  EXPECT_EQ(Boundaries(Restart()), saved) << "adopted durably";
}

TEST_F(JobRestartTest, ARankReRegisteringMidSwitchDoesNotTakeTheLayoutBack) {
  const auto plan = Committed();
  ASSERT_TRUE(job_->OnReport(0, Report(0, plan.apply_iteration(), plan.epoch())).ok());
  // Rank 1 still holds the plan it is switching to, with the old layout.
  dynmo::v1::RegisterRequest switching = Reg(1);
  switching.set_pending_epoch(plan.epoch());
  for (int b : {0, 2, 4, 6, 8}) switching.add_boundaries(b);
  dynmo::v1::RegisterResponse response;
  ASSERT_TRUE(job_->Register(switching, &response).ok());
  EXPECT_EQ(Boundaries(*job_), Boundaries(plan));
  // A rank under the applied epoch names its layout: nothing to adopt.
  dynmo::v1::RegisterRequest current = Reg(2);
  current.set_applied_epoch(plan.epoch());
  for (int b : {0, 2, 4, 6, 8}) current.add_boundaries(b);
  ASSERT_TRUE(job_->Register(current, &response).ok());
  EXPECT_EQ(Boundaries(*job_), Boundaries(plan));
}

TEST_F(JobRestartTest, AClaimedEpochOfAPreparingPlanIsIgnored) {
  const auto plan = Issue();
  // Two-phase: no rank can run a plan before its COMMIT.
  ASSERT_TRUE(job_->OnReport(0, Report(0, 1, plan.epoch())).ok());
  EXPECT_EQ(job_->Summary().plan_state(), "preparing");
  EXPECT_EQ(job_->Summary().applied_epoch(), 0u);
}

}  // namespace
}  // namespace dynmo::service
