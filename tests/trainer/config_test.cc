// TrainerConfig validation, boundaries parsing, the rank layout and the
// torchrun environment.
#include "trainer/config/config.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/comm/dist_env.h"

namespace dynmo::trainer {
namespace {

using ::testing::HasSubstr;

TrainerConfig Tiny() {
  TrainerConfig c;
  c.model.num_blocks = 4;
  c.model.hidden = 32;
  c.model.heads = 4;
  c.model.seq_len = 16;
  return c;
}

TEST(ConfigTest, ValidConfigPasses) {
  TrainerConfig c = Tiny();
  c.pp = 2;
  c.dp = 2;
  EXPECT_TRUE(ValidateConfig(c, 4).ok());
}

TEST(ConfigTest, WorldMustEqualPpTimesDp) {
  TrainerConfig c = Tiny();
  c.pp = 2;
  absl::Status s = ValidateConfig(c, 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("WORLD_SIZE=4"));
}

TEST(ConfigTest, MoreStagesThanPipelineLayersIsRejected) {
  TrainerConfig c = Tiny();  // 4 blocks -> 6 pipeline layers
  c.pp = 7;
  absl::Status s = ValidateConfig(c, 7);
  EXPECT_THAT(s.message(), HasSubstr("only 6 pipeline layers"));
  c.pp = 6;
  EXPECT_TRUE(ValidateConfig(c, 6).ok());
}

TEST(ConfigTest, HiddenMustBeDivisibleByHeads) {
  TrainerConfig c = Tiny();
  c.model.heads = 5;
  EXPECT_THAT(ValidateConfig(c, 1).message(), HasSubstr("not divisible"));
}

TEST(ConfigTest, NonPositiveSizesNameTheFlag) {
  TrainerConfig c = Tiny();
  c.microbatches = 0;
  EXPECT_THAT(ValidateConfig(c, 1).message(), HasSubstr("--microbatches"));
}

TEST(ConfigTest, BadInitialBoundariesAreRejected) {
  TrainerConfig c = Tiny();
  c.pp = 2;
  c.initial_boundaries = {0, 6, 6};  // empty last stage
  EXPECT_THAT(ValidateConfig(c, 2).message(), HasSubstr("--initial_boundaries"));
  c.initial_boundaries = {0, 3, 5};  // does not end at 6
  EXPECT_FALSE(ValidateConfig(c, 2).ok());
  c.initial_boundaries = {0, 1, 6};
  EXPECT_TRUE(ValidateConfig(c, 2).ok());
}

TEST(ConfigTest, StartingBoundariesDefaultToUniform) {
  TrainerConfig c = Tiny();
  c.pp = 4;
  absl::StatusOr<core::Boundaries> b = StartingBoundaries(c);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, (core::Boundaries{0, 2, 4, 5, 6}));
  c.initial_boundaries = {0, 1, 2, 3, 6};
  EXPECT_EQ(*StartingBoundaries(c), c.initial_boundaries);
}

TEST(ConfigTest, LayerParameterCountsFollowTheGptShapes) {
  ModelConfig m;  // hidden 64, vocab 256, seq 32, 4 blocks
  EXPECT_EQ(LayerParameterCount(m, 0), 256 * 64 + 32 * 64);
  EXPECT_EQ(LayerParameterCount(m, 1), 12 * 64 * 64 + 13 * 64);
  EXPECT_EQ(LayerParameterCount(m, 5), 64 * 256 + 2 * 64);
}

TEST(ConfigTest, HalvesSplitEachBlockIntoTwoLayersAndItsParameters) {
  ModelConfig m;
  m.num_blocks = 4;
  m.hidden = 64;
  m.vocab = 256;
  ModelConfig halves = m;
  halves.pipeline_units = "halves";
  EXPECT_EQ(halves.num_pipeline_layers(), 10);
  for (int block = 1; block <= 4; ++block) {
    EXPECT_EQ(LayerParameterCount(halves, 2 * block - 1) + LayerParameterCount(halves, 2 * block),
              LayerParameterCount(m, block));
  }
  EXPECT_EQ(LayerParameterCount(halves, 9), LayerParameterCount(m, 5));  // the head
}

TEST(ConfigTest, HalvesRefuseUnknownUnitsAndDynamicSchemes) {
  TrainerConfig c = Tiny();
  c.model.pipeline_units = "halves";
  EXPECT_TRUE(ValidateConfig(c, 1).ok());
  c.model.pipeline_units = "thirds";
  EXPECT_THAT(ValidateConfig(c, 1).message(), HasSubstr("blocks or halves"));
  c.model.pipeline_units = "halves";
  c.model.dynamism.cases = {"pruning"};
  EXPECT_THAT(ValidateConfig(c, 1).message(), HasSubstr("--dynamism=none only"));
}

TEST(ConfigTest, TestMigrationPolicyNeedsValidTargets) {
  TrainerConfig c = Tiny();
  c.pp = 2;
  c.test_migrate_every = 2;
  EXPECT_THAT(ValidateConfig(c, 2).message(), HasSubstr("--test_migration_boundaries"));
  c.test_migration_targets = {{0, 1, 6}, {0, 6}};
  EXPECT_THAT(ValidateConfig(c, 2).message(), HasSubstr("entry 0,6"));
  c.test_migration_targets = {{0, 1, 6}, {0, 5, 6}};
  EXPECT_TRUE(ValidateConfig(c, 2).ok());
}

TEST(ConfigTest, TestMigrationTargetsMayReleaseStagesButNeverReviveThem) {
  TrainerConfig c = Tiny();
  c.pp = 4;
  c.test_migrate_every = 2;
  c.test_migration_targets = {{0, 3, 6}, {0, 2, 6}};
  c.test_migration_stages = {{1, 2}, {}};  // then the same two stages
  EXPECT_TRUE(ValidateConfig(c, 4).ok()) << ValidateConfig(c, 4);
  c.test_migration_targets = {{0, 3, 6}, {0, 6}};
  EXPECT_THAT(ValidateConfig(c, 4).message(), HasSubstr("entry 0,6"));
  c.test_migration_targets = {{0, 3, 6}, {0, 3, 6}};
  c.test_migration_stages = {{1, 2}, {0, 1}};
  EXPECT_THAT(ValidateConfig(c, 4).message(), HasSubstr("not a subsequence"));
}

TEST(ConfigTest, ParseBoundariesReadsCommaSeparatedIntegers) {
  EXPECT_EQ(*ParseBoundaries("0,3,6"), (core::Boundaries{0, 3, 6}));
  EXPECT_FALSE(ParseBoundaries("0,x,6").ok());
  EXPECT_FALSE(ParseBoundaries("").ok());
}

TEST(ConfigTest, ReplicasOfAStageAreAdjacentRanks) {
  EXPECT_EQ(PositionOfRank(5, 2).stage, 2);
  EXPECT_EQ(PositionOfRank(5, 2).dp_rank, 1);
  EXPECT_EQ(RankAt(2, 1, 2), 5);
  for (int r = 0; r < 8; ++r) {
    RankPosition p = PositionOfRank(r, 4);
    EXPECT_EQ(RankAt(p.stage, p.dp_rank, 4), r);
  }
}

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(DistEnvTest, NoVariablesIsAWorldOfOne) {
  absl::StatusOr<DistEnv> env = ReadDistEnv(FakeEnv({}));
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->rank, 0);
  EXPECT_EQ(env->world_size, 1);
}

TEST(DistEnvTest, ReadsTorchrunVariables) {
  absl::StatusOr<DistEnv> env = ReadDistEnv(FakeEnv(
      {{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"},
       {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29511"}}));
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 3);
  EXPECT_EQ(env->world_size, 4);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->master_addr, "10.0.0.1");
  EXPECT_EQ(env->master_port, 29511);
}

TEST(DistEnvTest, RejectsMalformedOrInconsistentVariables) {
  EXPECT_THAT(ReadDistEnv(FakeEnv({{"RANK", "x"}})).status().message(),
              HasSubstr("RANK='x'"));
  EXPECT_THAT(ReadDistEnv(FakeEnv({{"RANK", "4"}, {"WORLD_SIZE", "4"},
                                   {"MASTER_PORT", "1"}}))
                  .status()
                  .message(),
              HasSubstr("outside"));
  EXPECT_THAT(ReadDistEnv(FakeEnv({{"WORLD_SIZE", "2"}})).status().message(),
              HasSubstr("MASTER_PORT"));
  EXPECT_FALSE(ReadDistEnv(FakeEnv({{"MASTER_PORT", "70000"}})).ok());
}

TEST(DistEnvTest, LocalRanksPreferLocalWorldSizeThenWorldSize) {
  EXPECT_EQ(LocalRanks(FakeEnv({})), 1);
  EXPECT_EQ(LocalRanks(FakeEnv({{"WORLD_SIZE", "8"}})), 8);
  EXPECT_EQ(LocalRanks(FakeEnv({{"LOCAL_WORLD_SIZE", "4"}, {"WORLD_SIZE", "8"}})), 4);
  // Not a positive number: unset.
  EXPECT_EQ(LocalRanks(FakeEnv({{"LOCAL_WORLD_SIZE", "x"}, {"WORLD_SIZE", "8"}})), 8);
  EXPECT_EQ(LocalRanks(FakeEnv({{"LOCAL_WORLD_SIZE", "0"}})), 1);
}

}  // namespace
}  // namespace dynmo::trainer
