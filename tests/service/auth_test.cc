// Authenticator: the principals file, the shared tokens, and who may call
// which service.
#include "coordinator/service/auth.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "grpcpp/server_context.h"
#include "grpcpp/test/server_context_test_spouse.h"
#include "gtest/gtest.h"

namespace dynmo::service {
namespace {

constexpr char kPrincipals[] = R"(# token                           name        roles
sched-token-0123456789               slurm       scheduler
ops-token-0123456789abcdef           alice       operator,scheduler
ranks-token-0123456789               trainers    agent   # the ranks' token
x509:node17.cluster                  node17      agent
)";

absl::StatusOr<Principal> Call(const Authenticator& auth, const std::string& token,
                               Role role) {
  grpc::ServerContext ctx;
  grpc::testing::ServerContextTestSpouse spouse(&ctx);
  if (!token.empty()) spouse.AddClientMetadata("authorization", "Bearer " + token);
  return auth.Check(ctx, role);
}

TEST(AuthenticatorTest, PrincipalsHaveTheirRolesAndNoOthers) {
  auto auth = Authenticator::ParsePrincipals(kPrincipals, "p.txt");
  ASSERT_TRUE(auth.ok()) << auth.status();
  auto slurm = Call(*auth, "sched-token-0123456789", Role::kScheduler);
  ASSERT_TRUE(slurm.ok()) << slurm.status();
  EXPECT_EQ(slurm->name, "slurm");
  EXPECT_TRUE(slurm->identified);
  auto denied = Call(*auth, "sched-token-0123456789", Role::kAgent);
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(denied.status().message().find("'slurm' lacks the agent role"), std::string::npos)
      << denied.status();
  EXPECT_TRUE(Call(*auth, "ops-token-0123456789abcdef", Role::kOperator).ok());
  EXPECT_TRUE(Call(*auth, "ops-token-0123456789abcdef", Role::kScheduler).ok());
  EXPECT_EQ(Call(*auth, "ranks-token-0123456789", Role::kOperator).status().code(),
            absl::StatusCode::kPermissionDenied)
      << "a trainer's token is no operator's";
  EXPECT_EQ(Call(*auth, "", Role::kAgent).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Call(*auth, "sched-token-012345678", Role::kScheduler).status().code(),
            absl::StatusCode::kUnauthenticated)
      << "a prefix of a token is no token";
  EXPECT_EQ(Call(*auth, "sched-token-0123456789x", Role::kScheduler).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(AuthenticatorTest, BadPrincipalsFilesNameTheLine) {
  struct Case {
    const char* text;
    const char* message;
  };
  for (const Case& c : {
           Case{"tok-0123456789abcdef alice\n", "p.txt:1: want <token"},
           Case{"# c\ntok-0123456789abcdef alice root\n", "p.txt:2: unknown role 'root'"},
           Case{"tok-0123456789abcdef alice agent ml\n", "p.txt:1: 'ml' is not tenant=<tenant>"},
           Case{"short alice agent\n", "at least 16 characters"},
           Case{"tok-0123456789abcdef a agent\ntok-0123456789abcdef b agent\n",
                "p.txt:2: token listed twice"},
           Case{"x509: a agent\n", "empty x509 identity"},
           Case{"# nothing\n\n", "p.txt: no principal"},
       }) {
    auto auth = Authenticator::ParsePrincipals(c.text, "p.txt");
    EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(auth.status().message().find(c.message), std::string::npos)
        << c.text << " -> " << auth.status();
  }
}

TEST(AuthenticatorTest, SharedTokensKeepTheirMeaning) {
  char tmpl[] = "/tmp/dynmo_auth_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::ofstream(dir + "/token") << "op-secret\n";
  std::ofstream(dir + "/agents") << "rank-secret\n";
  // One token: every role, no identity.
  auto one = Authenticator::FromFiles("", dir + "/token", "");
  ASSERT_TRUE(one.ok()) << one.status();
  auto op = Call(*one, "op-secret", Role::kAgent);
  ASSERT_TRUE(op.ok());
  EXPECT_FALSE(op->identified);
  // Two tokens: the agents' cannot operate, the operator's cannot register.
  auto two = Authenticator::FromFiles("", dir + "/token", dir + "/agents");
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_TRUE(Call(*two, "rank-secret", Role::kAgent).ok());
  EXPECT_EQ(Call(*two, "rank-secret", Role::kOperator).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Call(*two, "op-secret", Role::kAgent).status().code(),
            absl::StatusCode::kPermissionDenied);
  // Not both kinds; files that do not exist are named.
  std::ofstream(dir + "/p") << kPrincipals;
  EXPECT_EQ(Authenticator::FromFiles(dir + "/p", dir + "/token", "").status().code(),
            absl::StatusCode::kInvalidArgument);
  auto missing = Authenticator::FromFiles(dir + "/none", "", "");
  EXPECT_NE(missing.status().message().find(dir + "/none"), std::string::npos);
  // No auth: everyone, every role.
  Authenticator open;
  auto anyone = Call(open, "", Role::kScheduler);
  ASSERT_TRUE(anyone.ok());
  EXPECT_EQ(anyone->name, "anonymous");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dynmo::service
