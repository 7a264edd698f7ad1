// A job's owner is part of its record from its first registration: after a
// restart of the coordinator over the same state dir (what kill -9 or a
// SIGTERM leave behind), another principal registering the job's name is
// refused and the owner is let back in (issue 25 item 1).
#include <filesystem>
#include <memory>
#include <string>

#include "coordinator/service/coordinator.h"
#include "gtest/gtest.h"
#include "tests/service/job_state_fixture.h"
#include "tests/service/restarted_coordinator.h"

namespace dynmo::service {
namespace {

class JobOwnershipTest : public RestartedCoordinatorTest {
 protected:
  absl::Status RegisterAs(const std::string& principal, int rank = 0) {
    dynmo::v1::RegisterResponse response;
    return coordinator_->jobs().Register(Reg(rank), &response, principal).status();
  }
};

TEST_F(JobOwnershipTest, AnotherPrincipalCannotTakeAJobAfterARestart) {
  Start();
  ASSERT_TRUE(RegisterAs("alice").ok());
  Start();  // nothing but the registration happened before the restart
  const absl::Status bob = RegisterAs("bob");
  EXPECT_EQ(bob.code(), absl::StatusCode::kPermissionDenied) << bob;
  EXPECT_NE(bob.message().find("alice"), std::string::npos) << bob;
  EXPECT_TRUE(RegisterAs("alice").ok());
  EXPECT_TRUE(RegisterAs("alice", 1).ok());
}

TEST_F(JobOwnershipTest, TheOwnerIsInTheSavedRecordBeforeRegisterAnswers) {
  Start();
  ASSERT_TRUE(RegisterAs("alice").ok());
  StateStore store(dir_);
  absl::StatusOr<std::optional<dynmo::v1::CoordinatorState>> saved = store.Load();
  ASSERT_TRUE(saved.ok() && saved->has_value()) << saved.status();
  ASSERT_EQ((*saved)->jobs_size(), 1);
  EXPECT_EQ((*saved)->jobs(0).name(), "job");
  EXPECT_EQ((*saved)->jobs(0).owner(), "alice");
}

}  // namespace
}  // namespace dynmo::service
