#include "launcher/rank_env.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dynmo::launcher {
namespace {

using ::testing::Contains;
using ::testing::IsSupersetOf;
using ::testing::Not;

TEST(RankEnvironmentTest, SetsTorchrunAndDynmoVariablesForTheRank) {
  JobEnvironment job{4, "127.0.0.1", 29500, "demo", "127.0.0.1:7000"};
  const std::vector<std::string> env =
      RankEnvironment({"PATH=/bin", "HOME=/root"}, job, 2);
  EXPECT_THAT(env, IsSupersetOf({"PATH=/bin", "HOME=/root", "RANK=2",
                                 "LOCAL_RANK=2", "WORLD_SIZE=4",
                                 "LOCAL_WORLD_SIZE=4", "MASTER_ADDR=127.0.0.1",
                                 "MASTER_PORT=29500", "DYNMO_JOB=demo",
                                 "DYNMO_COORDINATOR=127.0.0.1:7000"}));
  EXPECT_EQ(env.size(), 10u);
}

TEST(RankEnvironmentTest, ReplacesInheritedValues) {
  JobEnvironment job{2, "127.0.0.1", 1234, "j", "127.0.0.1:1"};
  const std::vector<std::string> env =
      RankEnvironment({"RANK=7", "WORLD_SIZE=9", "MASTER_PORT=1"}, job, 1);
  EXPECT_THAT(env, Not(Contains("RANK=7")));
  EXPECT_THAT(env, Not(Contains("WORLD_SIZE=9")));
  EXPECT_THAT(env, Not(Contains("MASTER_PORT=1")));
  EXPECT_THAT(env, IsSupersetOf({"RANK=1", "WORLD_SIZE=2", "MASTER_PORT=1234"}));
}

TEST(RankEnvironmentTest, NoCoordinatorRemovesAnInheritedAddress) {
  JobEnvironment job{1, "127.0.0.1", 1234, "j", ""};
  const std::vector<std::string> env =
      RankEnvironment({"DYNMO_COORDINATOR=10.0.0.1:50051"}, job, 0);
  for (const std::string& e : env) {
    EXPECT_NE(e.rfind("DYNMO_COORDINATOR=", 0), 0u) << e;
  }
}

}  // namespace
}  // namespace dynmo::launcher
