// Finer pipeline units in dynmo-train, end to end (--pipeline_units=halves):
// every decoder block becomes two pipeline layers (its attention half and
// its MLP half, trainer/model/decoder_half.h), so a stage may hold 1.5 blocks.
// The model starts from the same weights and computes the same arithmetic
// as the one cut in blocks, so the losses are bit-identical — at pp=1, on a
// stage boundary inside a block, and across live migrations that move a
// half-block with its AdamW state. Combinations the halves do not support
// are refused.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/trainer/train_job.h"

namespace dynmo::trainer {
namespace {

using ::testing::HasSubstr;

TEST(DynmoTrainPipelineUnitsTest, HalvesComputeTheBlocksLossesBitForBit) {
  JobResult blocks = RunJob(0, ElasticTinyModel());
  JobResult halves = RunJob(0, ElasticTinyModel({"--pipeline_units=halves"}));
  ASSERT_TRUE(blocks.ok()) << blocks.AllLogs();
  ASSERT_TRUE(halves.ok()) << halves.AllLogs();
  ASSERT_EQ(blocks.losses.size(), 7u);
  EXPECT_EQ(halves.losses, blocks.losses);
  // 4 blocks: embedding, 8 halves, head.
  EXPECT_EQ(halves.records[0]["layer_forward_s"].size(), 10u);
  EXPECT_EQ(halves.records[0]["boundaries"], nlohmann::json::array({0, 10}));
}

TEST(DynmoTrainPipelineUnitsTest, AStageHoldsOneAndAHalfBlocksAndAHalfBlockMigrates) {
  JobResult blocks = RunJob(0, ElasticTinyModel());
  // Stage 0: embedding, block 1, block 2's attention half (layers 0..3);
  // then block 2's MLP half (layer 4) moves to stage 0, then layers 3 and 4
  // (all of block 2) move to stage 1.
  JobResult halves = RunJob(
      2, ElasticTinyModel({"--pipeline_units=halves", "--pp=2", "--initial_boundaries=0,4,10",
                           "--test_migrate_every=2",
                           "--test_migration_boundaries=0,5,10;0,3,10"}));
  ASSERT_TRUE(blocks.ok()) << blocks.AllLogs();
  ASSERT_TRUE(halves.ok()) << halves.AllLogs();
  EXPECT_EQ(halves.losses, blocks.losses);
  EXPECT_EQ(halves.records[0]["boundaries"], nlohmann::json::array({0, 4, 10}));
  EXPECT_EQ(halves.records[2]["boundaries"], nlohmann::json::array({0, 5, 10}));
  EXPECT_EQ(halves.records[4]["boundaries"], nlohmann::json::array({0, 3, 10}));
}

TEST(DynmoTrainPipelineUnitsTest, UnsupportedCombinationsAreRefused) {
  struct Case {
    std::vector<std::string> flags;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{"--pipeline_units=thirds"}, "--pipeline_units must be blocks or halves"},
      {{"--pipeline_units=halves", "--dynamism=moe"},
       "--pipeline_units=halves supports --dynamism=none only"},
  };
  for (const Case& c : cases) {
    JobResult r = RunJob(0, ElasticTinyModel(c.flags));
    EXPECT_EQ(r.exit_codes[0], 2) << r.AllLogs();  // a bad command line
    EXPECT_THAT(r.logs[0], HasSubstr(c.error)) << r.logs[0];
  }
}

}  // namespace
}  // namespace dynmo::trainer
