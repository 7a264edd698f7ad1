// Ownership kept (issue 43 item 4): an operator acts on the jobs of its own
// tenant only, an admin on every job; a deleted job's name stays its
// owner's (a tombstone, also across a restart) until the owner's side or an
// admin releases it.
#include <filesystem>
#include <memory>
#include <string>

#include "coordinator/service/auth.h"
#include "coordinator/service/coordinator.h"
#include "gtest/gtest.h"
#include "tests/service/grpc_api_helpers.h"

namespace dynmo::service {
namespace {

constexpr char kAliceRanks[] = "alice-ranks-token-0001";
constexpr char kAlice[] = "alice-ops-token-000001";
constexpr char kBobRanks[] = "bob-ranks-token-000001";
constexpr char kBob[] = "bob-ops-token-00000001";
constexpr char kRoot[] = "root-admin-token-00001";

std::string Principals() {
  return std::string(kAliceRanks) + " alice-ranks agent tenant=team-a\n" + kAlice +
         " alice operator tenant=team-a\n" + kBobRanks + " bob-ranks agent tenant=team-b\n" +
         kBob + " bob operator tenant=team-b\n" + kRoot + " root admin\n";
}

class OperatorScopeTest : public GrpcApiTest {
 protected:
  grpc::Status Get(const std::string& token, const std::string& job = "api") {
    grpc::ClientContext ctx;
    agent::AddBearerToken(&ctx, token);
    dynmo::v1::GetJobRequest req;
    req.set_job(job);
    dynmo::v1::JobStatus status;
    return ops_->GetJob(&ctx, req, &status);
  }
  int Listed(const std::string& token) {
    grpc::ClientContext ctx;
    agent::AddBearerToken(&ctx, token);
    dynmo::v1::ListJobsResponse jobs;
    EXPECT_TRUE(ops_->ListJobs(&ctx, dynmo::v1::ListJobsRequest(), &jobs).ok());
    return jobs.jobs_size();
  }
  grpc::Status Delete(const std::string& token, bool release_name) {
    grpc::ClientContext ctx;
    agent::AddBearerToken(&ctx, token);
    dynmo::v1::DeleteJobRequest req;
    req.set_job("api");
    req.set_force(true);
    req.set_release_name(release_name);
    dynmo::v1::DeleteJobResponse resp;
    return ops_->DeleteJob(&ctx, req, &resp);
  }
  grpc::Status Rebalance(const std::string& token) {
    grpc::ClientContext ctx;
    agent::AddBearerToken(&ctx, token);
    dynmo::v1::RebalanceRequest req;
    req.set_job("api");
    dynmo::v1::RebalanceResponse resp;
    return ops_->Rebalance(&ctx, req, &resp);
  }
};

TEST_F(OperatorScopeTest, AnOperatorActsOnItsOwnTenantsJobsAndAnAdminOnAll) {
  StartServer("", false, "", Principals());
  ASSERT_TRUE(Register(Reg(0), kAliceRanks).ok());
  EXPECT_TRUE(Get(kAlice).ok()) << "alice-ranks is of alice's tenant";
  EXPECT_EQ(Get(kBob).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Rebalance(kBob).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Delete(kBob, false).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Listed(kAlice), 1);
  EXPECT_EQ(Listed(kBob), 0) << "another tenant's jobs are not even listed";
  EXPECT_TRUE(Get(kRoot).ok());
  EXPECT_EQ(Listed(kRoot), 1);
  EXPECT_TRUE(Get(kAlice).ok()) << "bob's attempts changed nothing";
}

TEST_F(OperatorScopeTest, ADeletedJobsNameStaysItsOwnersUntilReleased) {
  StartServer("", false, "", Principals());
  ASSERT_TRUE(Register(Reg(0), kAliceRanks).ok());
  ASSERT_TRUE(Delete(kRoot, /*release_name=*/false).ok());
  const grpc::Status taken = Register(Reg(0), kBobRanks);
  EXPECT_EQ(taken.error_code(), grpc::StatusCode::PERMISSION_DENIED) << taken.error_message();
  EXPECT_NE(taken.error_message().find("alice-ranks"), std::string::npos);
  // Bob's operator cannot release another tenant's name either.
  EXPECT_EQ(Delete(kBob, true).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // The owner comes back to its name...
  ASSERT_TRUE(Register(Reg(0), kAliceRanks).ok());
  // ... and its tenant gives it up: then anyone may take it.
  ASSERT_TRUE(Delete(kAlice, /*release_name=*/true).ok());
  EXPECT_TRUE(Register(Reg(0), kBobRanks).ok());
}

TEST(JobTombstoneTest, ATombstoneSurvivesARestart) {
  const std::string dir = TempDir("tomb");
  CoordinatorOptions options;
  options.state_dir = dir;
  dynmo::v1::RegisterResponse response;
  {
    auto c = Coordinator::Create(options);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->jobs().Register(Reg(0), &response, "alice").ok());
    ASSERT_TRUE((*c)->jobs().Delete("api", /*force=*/true).ok());
  }
  {
    auto c = Coordinator::Create(options);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ((*c)->jobs().Register(Reg(0), &response, "bob").status().code(),
              absl::StatusCode::kPermissionDenied);
    EXPECT_EQ((*c)->jobs().TombstoneOwner("api").value_or(""), "alice");
    EXPECT_TRUE((*c)->jobs().Register(Reg(0), &response, "alice").ok());
    EXPECT_FALSE((*c)->jobs().TombstoneOwner("api").has_value());
  }
  std::filesystem::remove_all(dir);
}

TEST(AuthenticatorScopeTest, TenantsAndTheAdminRole) {
  absl::StatusOr<Authenticator> auth = Authenticator::ParsePrincipals(Principals(), "p");
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ(auth->TenantOf("alice-ranks"), "team-a");
  EXPECT_EQ(auth->TenantOf("root"), "root");
  EXPECT_EQ(auth->TenantOf("unknown"), "unknown");
  const Principal bob{"bob", static_cast<uint32_t>(Role::kOperator), true, "team-b"};
  const Principal root{"root", static_cast<uint32_t>(Role::kAdmin), true, ""};
  const Principal shared{"operator", static_cast<uint32_t>(Role::kOperator), false, ""};
  EXPECT_FALSE(auth->MayAct(bob, "alice-ranks"));
  EXPECT_TRUE(auth->MayAct(bob, "bob-ranks"));
  EXPECT_FALSE(auth->MayAct(bob, "")) << "a job of no named owner: admins only";
  EXPECT_TRUE(auth->MayAct(root, "alice-ranks"));
  EXPECT_TRUE(auth->MayAct(shared, "alice-ranks")) << "shared tokens name no one";
  EXPECT_FALSE(Authenticator::ParsePrincipals("abcdefghijklmnopq x agent team-a\n", "p").ok());
}

}  // namespace
}  // namespace dynmo::service
