// Iterations and epochs only within a window of the job's current ones
// (JobOptions::iteration_window, epoch_window): a report, ack or
// registration beyond it is refused with INVALID_ARGUMENT and changes
// nothing; one at the edge of the window is accepted.
#include <string>

#include "gtest/gtest.h"
#include "tests/service/job_state_fixture.h"

namespace dynmo::service {
namespace {

constexpr int64_t kWindow = 1'000'000;  // JobOptions' default

class JobWindowTest : public JobStateTest {};

TEST_F(JobWindowTest, AReportFarBeyondTheNewestIterationIsRefusedAndChangesNothing) {
  ReportAll(100);
  const dynmo::v1::JobRecord before = job_->Record();
  const absl::Status far = job_->OnReport(1, Report(1, 100 + kWindow + 1));
  EXPECT_EQ(far.code(), absl::StatusCode::kInvalidArgument) << far;
  EXPECT_NE(far.message().find("--iteration_window"), std::string::npos) << far;
  EXPECT_EQ(job_->Summary().last_iteration(), 100);
  EXPECT_EQ(job_->Record().SerializeAsString(), before.SerializeAsString());
  // The newest plan still applies a lead ahead of the true newest iteration.
  auto reb = job_->Rebalance(absl::Now());
  ASSERT_TRUE(reb.ok() && reb->issued()) << reb.status();
  EXPECT_EQ(reb->plan().apply_iteration(), 100 + 5);
  // The edge of the window is fine; going back (a restart from a
  // checkpoint) too.
  EXPECT_TRUE(job_->OnReport(1, Report(1, 100 + kWindow)).ok());
  EXPECT_TRUE(job_->OnReport(2, Report(2, 3)).ok());
}

TEST_F(JobWindowTest, AHostBatchWithOneBadIterationAppliesNone) {
  ReportAll(10);
  dynmo::v1::HostBatch batch;
  auto* good = batch.add_messages();
  good->set_rank(0);
  *good->mutable_report() = Report(0, 11);
  auto* bad = batch.add_messages();
  bad->set_rank(1);
  *bad->mutable_report() = Report(1, int64_t{1} << 52);
  EXPECT_EQ(job_->OnHostBatch(batch).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(job_->Summary().last_iteration(), 10) << "the good report was applied";
}

TEST_F(JobWindowTest, ReportsAndAcksBeyondTheJobsEpochAreInvalid) {
  const auto plan = Issue();
  const absl::Status report = job_->OnReport(0, Report(0, 1, plan.epoch() + 1));
  EXPECT_EQ(report.code(), absl::StatusCode::kInvalidArgument) << report;
  const absl::Status ack = job_->OnAck(0, Ack(plan.epoch() + 1, PlanAck::PREPARED));
  EXPECT_EQ(ack.code(), absl::StatusCode::kInvalidArgument) << ack;
  const absl::Status late = job_->OnAck(0, Ack(plan.epoch(), PlanAck::PREPARED, kWindow + 1));
  EXPECT_EQ(late.code(), absl::StatusCode::kInvalidArgument) << late;
  EXPECT_EQ(job_->Summary().plan_state(), "preparing");
  EXPECT_EQ(job_->Summary().epoch(), plan.epoch());
}

TEST_F(JobWindowTest, ARegistrationFarBeyondTheEpochIsRefusedOneWithinIsAdoptedByANewJobOnly) {
  dynmo::v1::RegisterRequest far = Reg(2);
  far.set_applied_epoch(kWindow + 1);
  dynmo::v1::RegisterResponse response;
  const absl::Status s = job_->Register(far, &response);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("--epoch_window"), std::string::npos) << s;
  EXPECT_EQ(job_->Summary().epoch(), 0u);
  dynmo::v1::RegisterRequest pending = Reg(2);
  pending.set_pending_epoch(kWindow + 1);
  EXPECT_EQ(job_->Register(pending, &response).code(), absl::StatusCode::kInvalidArgument);
  // Within the window, an epoch this job never issued is refused while its
  // other ranks run epoch 0 (issue 43: a forged or foreign claim)...
  dynmo::v1::RegisterRequest lost = Reg(2);
  lost.set_applied_epoch(7);
  EXPECT_EQ(job_->Register(lost, &response).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(job_->Summary().epoch(), 0u);
  // ... and adopted as the first rank of a job that never planned: the state
  // dir was lost and the ranks ran 7 plans.
  JobState fresh(lost, options_, JobDeps{keeper_.get(), pool_.get(), nullptr});
  ASSERT_TRUE(fresh.Register(lost, &response).ok());
  EXPECT_EQ(fresh.Summary().epoch(), 7u);
  EXPECT_EQ(fresh.Summary().applied_epoch(), 7u);
}

}  // namespace
}  // namespace dynmo::service
