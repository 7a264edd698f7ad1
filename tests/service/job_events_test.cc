// A job's decisions in the event log (event_log.h): each plan step is one
// line with its fields, an aborted plan a warning with its reason.
#include <sstream>
#include <string>

#include "coordinator/service/event_log.h"
#include "gtest/gtest.h"
#include "tests/service/job_state_fixture.h"

namespace dynmo::service {
namespace {

class JobEventsTest : public JobStateTest {
 protected:
  void SetUp() override {
    ConfigureEventLog(EventLogOptions{LogFormat::kLogfmt, LogLevel::kDebug, &log_});
    JobStateTest::SetUp();
  }
  void TearDown() override {
    ConfigureEventLog(EventLogOptions{});
    JobStateTest::TearDown();
  }
  // The line of `event`, or "" when there is none.
  std::string Line(const std::string& event) const {
    std::istringstream in(log_.str());
    for (std::string line; std::getline(in, line);) {
      if (line.find(" event=" + event + " ") != std::string::npos) return line;
    }
    return "";
  }
  std::ostringstream log_;
};

TEST_F(JobEventsTest, IssuedCommittedAndAppliedPlansAreOneLineEach) {
  const auto plan = Issue();
  const std::string issued = Line("plan_issued");
  ASSERT_FALSE(issued.empty()) << log_.str();
  for (const std::string field :
       {"level=info", "job=job", "epoch=1", "reason=", "boundaries_from=0,2,4,6,8",
        "boundaries_to=", "stages=0,1,2,3", "apply_iteration=5", "migrations=",
        "migration_bytes=", "prepare_ranks=4", "prepare_sessions=4"}) {
    EXPECT_NE(issued.find(field), std::string::npos) << field << "\n" << issued;
  }
  for (int r = 0; r < kStages; ++r) {
    ASSERT_TRUE(job_->OnAck(r, Ack(plan.epoch(), PlanAck::PREPARED)).ok());
  }
  EXPECT_NE(Line("plan_committed").find("job=job epoch=1"), std::string::npos) << log_.str();
  ASSERT_TRUE(job_->OnAck(0, Ack(plan.epoch(), PlanAck::APPLIED, 5)).ok());
  const std::string applied = Line("plan_applied");
  EXPECT_NE(applied.find("job=job epoch=1 apply_iteration=5 reason="), std::string::npos)
      << log_.str();
  EXPECT_NE(applied.find(" boundaries="), std::string::npos) << applied;
}

TEST_F(JobEventsTest, AnAbortedPlanIsAWarningWithItsReason) {
  const auto plan = Issue();
  ASSERT_TRUE(job_->OnAck(2, Ack(plan.epoch(), PlanAck::FAILED)).ok());
  const std::string aborted = Line("plan_aborted");
  ASSERT_FALSE(aborted.empty()) << log_.str();
  EXPECT_NE(aborted.find("level=warning"), std::string::npos) << aborted;
  EXPECT_NE(aborted.find("job=job epoch=1 reason=\"rank 2"), std::string::npos) << aborted;
}

TEST_F(JobEventsTest, PlanEventsBelowTheLevelAreLeftOut) {
  ConfigureEventLog(EventLogOptions{LogFormat::kLogfmt, LogLevel::kWarning, &log_});
  const auto plan = Issue();
  ASSERT_TRUE(job_->OnAck(1, Ack(plan.epoch(), PlanAck::FAILED)).ok());
  EXPECT_TRUE(Line("plan_issued").empty()) << log_.str();
  EXPECT_FALSE(Line("plan_aborted").empty()) << log_.str();
}

}  // namespace
}  // namespace dynmo::service
