// Elastic re-packing in dynmo-train, end to end: ranks are real processes of
// the built binary on loopback. A layout step that keeps fewer stages moves
// the released stages' layers (weights + AdamW state) to the survivors,
// rebuilds the c10d groups over the survivors with new rank numbers, and
// lets the released ranks exit 0; the survivors train on without a restart.
// The losses must not change by a single bit (every layout computes the same
// arithmetic, tests/trainer/dynmo_train_test.cc), whether the step comes
// from the test policy or from the coordinator's re-packing plan.
#include <chrono>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/trainer/train_job.h"

namespace dynmo::trainer {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

bool Released(const std::string& log) { return log.find("released by") != std::string::npos; }

TEST(DynmoTrainRepackTest, FourStagesRepackedToTwoReleaseTheOuterRanksBitIdentically) {
  JobResult one = RunJob(1, ElasticTinyModel());
  // Iteration 3 keeps stages 1 and 2: ranks 0 and 3 leave, and rank 0 served
  // the job's store, so the survivors rendezvous on a fresh one.
  JobResult four = RunJob(4, ElasticTinyModel({"--pp=4", "--test_migrate_every=3",
                                        "--test_migration_boundaries=1,2@0,3,6"}));
  ASSERT_TRUE(one.ok()) << one.AllLogs();
  ASSERT_TRUE(four.ok()) << four.AllLogs();  // released ranks exit 0 too
  ASSERT_EQ(one.losses.size(), 7u);
  EXPECT_EQ(four.losses, one.losses);
  EXPECT_TRUE(Released(four.logs[0])) << four.logs[0];
  EXPECT_TRUE(Released(four.logs[3])) << four.logs[3];
  EXPECT_FALSE(Released(four.logs[1])) << four.logs[1];
  EXPECT_FALSE(Released(four.logs[2])) << four.logs[2];
  EXPECT_THAT(four.logs[0], HasSubstr("rank 0 (stage 0) released by the test policy at iteration 3"));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(four.records[i]["active_ranks"], 4);
  for (int i = 3; i < 7; ++i) {
    EXPECT_EQ(four.records[i]["active_ranks"], 2);
    EXPECT_EQ(four.records[i]["boundaries"], nlohmann::json::array({0, 3, 6}));
    EXPECT_EQ(four.records[i]["stage_times"].size(), 2u);
  }
  // The survivors' new rank 0 (old rank 1) continues the log and finishes.
  EXPECT_THAT(four.logs[1], HasSubstr("| ranks 2"));
  EXPECT_THAT(four.logs[1], HasSubstr("dynmo-train: done, 7 iterations"));
  EXPECT_THAT(four.logs[0], Not(HasSubstr("dynmo-train: done")));
}

TEST(DynmoTrainRepackTest, TwoRepacksInARowShrinkFourStagesToOneBitIdentically) {
  JobResult one = RunJob(1, ElasticTinyModel());
  // First the last two stages leave (the store's server, rank 0, stays),
  // then stage 0 itself, while layers keep moving with their AdamW state.
  JobResult four = RunJob(4, ElasticTinyModel({"--pp=4", "--test_migrate_every=2",
                                        "--test_migration_boundaries=0,1@0,2,6;1@0,6"}));
  ASSERT_TRUE(one.ok()) << one.AllLogs();
  ASSERT_TRUE(four.ok()) << four.AllLogs();
  EXPECT_EQ(four.losses, one.losses);
  for (int r : {0, 2, 3}) EXPECT_TRUE(Released(four.logs[r])) << four.logs[r];
  EXPECT_FALSE(Released(four.logs[1]));
  EXPECT_EQ(four.records[1]["active_ranks"], 4);
  EXPECT_EQ(four.records[2]["active_ranks"], 2);
  EXPECT_EQ(four.records[2]["boundaries"], nlohmann::json::array({0, 2, 6}));
  EXPECT_EQ(four.records[4]["active_ranks"], 1);
  EXPECT_EQ(four.records[6]["boundaries"], nlohmann::json::array({0, 6}));
  EXPECT_EQ(four.records[6]["epoch"], 2);  // a releasing list is walked once
}

TEST(DynmoTrainRepackTest, DataParallelRepackReleasesEveryReplicaOfTheStage) {
  const std::vector<std::string> shape = {"--steps=5", "--pp=2", "--dp=2",
                                          "--microbatches=2"};
  std::vector<std::string> repacking = shape;
  repacking.push_back("--test_migrate_every=2");
  repacking.push_back("--test_migration_boundaries=1@0,6");
  JobResult still = RunJob(4, ElasticTinyModel(shape));
  JobResult packed = RunJob(4, ElasticTinyModel(repacking));
  ASSERT_TRUE(still.ok()) << still.AllLogs();
  ASSERT_TRUE(packed.ok()) << packed.AllLogs();
  ASSERT_EQ(still.losses.size(), 5u);
  EXPECT_EQ(packed.losses, still.losses);
  EXPECT_TRUE(Released(packed.logs[0]));
  EXPECT_TRUE(Released(packed.logs[1]));
  EXPECT_FALSE(Released(packed.logs[2]));
  EXPECT_FALSE(Released(packed.logs[3]));
  EXPECT_EQ(packed.records[4]["active_ranks"], 2);
  EXPECT_EQ(packed.records[4]["boundaries"], nlohmann::json::array({0, 6}));
}

TEST(DynmoTrainRepackTest, EmbeddedCoordinatorRepackPlanReleasesARankAndTrainingGoesOn) {
  // Tolerance 10 lets the coordinator's RepackOptimal pack two stages onto
  // one (one stage's bottleneck is at most twice the two-stage optimum).
  const std::vector<std::string> flags = {"--steps=30"};
  JobResult one = RunJob(1, ElasticTinyModel(flags));
  JobResult two = RunJob(
      2, ElasticTinyModel({"--steps=30", "--pp=2", "--coordinator=embedded", "--job=repack",
                    "--trigger=every:3", "--repack", "--repack_tolerance=10"}),
      std::chrono::seconds(120));
  ASSERT_TRUE(one.ok()) << one.AllLogs();
  ASSERT_TRUE(two.ok()) << two.AllLogs();
  ASSERT_EQ(two.losses.size(), 30u) << two.AllLogs();
  EXPECT_EQ(two.losses, one.losses);
  EXPECT_EQ(two.records.front()["active_ranks"], 2);
  EXPECT_EQ(two.records.back()["active_ranks"], 1) << two.AllLogs();
  EXPECT_EQ(two.records.back()["boundaries"], nlohmann::json::array({0, 6}));
  EXPECT_GT(two.records.back()["epoch"].get<int64_t>(), 0);
  EXPECT_NE(Released(two.logs[0]), Released(two.logs[1])) << two.AllLogs();
  EXPECT_THAT(two.AllLogs(), HasSubstr("re-packed: released"));
}

}  // namespace
}  // namespace dynmo::trainer
