// dynmo-train end to end over --backend=nccl-double: Gloo behind the test
// double that completes point-to-point ops as NCCL does (a receive holds
// 0xFF poison until the Work NCCL would complete is waited on; ops that do
// not pair in order are refused). Every pipeline exchange, live migration,
// re-pack and re-shape runs through it, and the losses must be the Gloo
// run's bit for bit: a read before the data landed would put NaN in them.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/trainer/train_job.h"

namespace dynmo::trainer {
namespace {

std::vector<std::string> With(std::vector<std::string> flags,
                              const std::vector<std::string>& extra) {
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

const std::string kDouble = "--backend=nccl-double";

TEST(DynmoTrainNcclDoubleTest, PipelineAndLiveMigrationAreBitIdenticalToGloo) {
  JobResult one = RunJob(1, ElasticTinyModel());
  JobResult two = RunJob(2, ElasticTinyModel({kDouble, "--pp=2", "--test_migrate_every=2",
                                              "--test_migration_boundaries=0,1,6;0,5,6"}));
  JobResult four = RunJob(4, ElasticTinyModel({kDouble, "--pp=4", "--test_migrate_every=2",
                                               "--test_migration_boundaries=0,1,2,3,6"}));
  ASSERT_TRUE(one.ok()) << one.AllLogs();
  ASSERT_TRUE(two.ok()) << two.AllLogs();
  ASSERT_TRUE(four.ok()) << four.AllLogs();
  ASSERT_EQ(one.losses.size(), 7u);
  EXPECT_EQ(two.losses, one.losses);
  EXPECT_EQ(four.losses, one.losses);
  EXPECT_EQ(two.records[2]["boundaries"], nlohmann::json::array({0, 1, 6}));
  EXPECT_EQ(four.records[2]["boundaries"], nlohmann::json::array({0, 1, 2, 3, 6}));
}

TEST(DynmoTrainNcclDoubleTest, RepackIsBitIdenticalToGloo) {
  const std::vector<std::string> repack = {"--pp=4", "--test_migrate_every=3",
                                           "--test_migration_boundaries=1,2@0,3,6"};
  JobResult gloo = RunJob(4, ElasticTinyModel(repack));
  JobResult nccl = RunJob(4, ElasticTinyModel(With(repack, {kDouble})));
  ASSERT_TRUE(gloo.ok()) << gloo.AllLogs();
  ASSERT_TRUE(nccl.ok()) << nccl.AllLogs();
  ASSERT_EQ(gloo.losses.size(), 7u);
  EXPECT_EQ(nccl.losses, gloo.losses);
  EXPECT_EQ(nccl.records[6]["active_ranks"], 2);
}

TEST(DynmoTrainNcclDoubleTest, ReshapeIsBitIdenticalToGloo) {
  const std::vector<std::string> reshape = {"--pp=4", "--test_reshape_at=3:2x2:0,3,6"};
  JobResult gloo = RunJob(4, ElasticTinyModel(reshape));
  JobResult nccl = RunJob(4, ElasticTinyModel(With(reshape, {kDouble})));
  ASSERT_TRUE(gloo.ok()) << gloo.AllLogs();
  ASSERT_TRUE(nccl.ok()) << nccl.AllLogs();
  ASSERT_EQ(gloo.losses.size(), 7u);
  EXPECT_EQ(nccl.losses, gloo.losses);
  EXPECT_EQ(nccl.records[6]["microbatches"], 2);
}

}  // namespace
}  // namespace dynmo::trainer
