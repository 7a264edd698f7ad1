// The gradual pruning schedule (trainer/dynamism/pruning_schedule.h): the
// Zhu & Gupta closed form at its start, end and midpoints, which iterations
// prune, and the flags' validation through --dynamism parsing.
#include "trainer/dynamism/pruning_schedule.h"

#include <cmath>

#include "gtest/gtest.h"
#include "trainer/config/dynamism_config.h"
#include "trainer/config/pruning_config.h"

namespace dynmo::trainer {
namespace {

PruningConfig Paper() { return PruningConfig{}; }  // 3000..7000 every 1000 to 0.9

TEST(PruningSchedule, TargetIsInitialSparsityAtStartAndFinalAtEnd) {
  PruningConfig c = Paper();
  c.initial_sparsity = 0.2;
  EXPECT_DOUBLE_EQ(TargetSparsity(c, 3000), 0.2);
  EXPECT_DOUBLE_EQ(TargetSparsity(c, 7000), 0.9);
}

TEST(PruningSchedule, TargetAtMidpointsFollowsTheCubicClosedForm) {
  const PruningConfig c = Paper();
  // S_t = 0.9 + (0 - 0.9)(1 - (t - 3000) / 4000)^3
  EXPECT_NEAR(TargetSparsity(c, 4000), 0.9 - 0.9 * 0.75 * 0.75 * 0.75, 1e-12);
  EXPECT_NEAR(TargetSparsity(c, 5000), 0.7875, 1e-12);
  EXPECT_NEAR(TargetSparsity(c, 6000), 0.9 - 0.9 * 0.25 * 0.25 * 0.25, 1e-12);
  EXPECT_NEAR(TargetSparsity(c, 3500), 0.9 - 0.9 * std::pow(0.875, 3), 1e-12);
}

TEST(PruningSchedule, TargetIsDenseBeforeStartAndFinalAfterEnd) {
  const PruningConfig c = Paper();
  EXPECT_EQ(TargetSparsity(c, 0), 0);
  EXPECT_EQ(TargetSparsity(c, 2999), 0);
  EXPECT_DOUBLE_EQ(TargetSparsity(c, 7001), 0.9);
  EXPECT_DOUBLE_EQ(TargetSparsity(c, 100000), 0.9);
}

TEST(PruningSchedule, TargetNeverDecreases) {
  const PruningConfig c = Paper();
  double last = 0;
  for (int64_t t = 0; t <= 8000; t += 50) {
    EXPECT_GE(TargetSparsity(c, t), last) << t;
    last = TargetSparsity(c, t);
  }
}

TEST(PruningSchedule, SingleStepScheduleGoesStraightToFinal) {
  PruningConfig c;
  c.start = c.end = 5;
  c.every = 1;
  c.final_sparsity = 0.5;
  EXPECT_TRUE(IsPruningStep(c, 5));
  EXPECT_DOUBLE_EQ(TargetSparsity(c, 5), 0.5);
}

TEST(PruningSchedule, PrunesExactlyAtStartPlusMultiplesOfEveryUpToEnd) {
  const PruningConfig c = Paper();
  for (int64_t t : {3000, 4000, 5000, 6000, 7000}) EXPECT_TRUE(IsPruningStep(c, t)) << t;
  for (int64_t t : {0, 2000, 2999, 3001, 3500, 6999, 8000}) {
    EXPECT_FALSE(IsPruningStep(c, t)) << t;
  }
}

TEST(PruningSchedule, ValidationRejectsBadValuesNamingTheFlag) {
  auto error = [](PruningConfig c) { return std::string(ValidatePruningConfig(c).message()); };
  EXPECT_TRUE(ValidatePruningConfig(Paper()).ok());
  PruningConfig c = Paper();
  c.end = 2000;
  EXPECT_NE(error(c).find("--prune_end"), std::string::npos);
  c = Paper();
  c.every = 0;
  EXPECT_NE(error(c).find("--prune_every"), std::string::npos);
  c = Paper();
  c.every = 300;  // 4000 is not a multiple
  EXPECT_NE(error(c).find("--prune_every"), std::string::npos);
  c = Paper();
  c.final_sparsity = 1.0;
  EXPECT_NE(error(c).find("--prune_final_sparsity"), std::string::npos);
  c = Paper();
  c.initial_sparsity = 0.95;  // above the final one
  EXPECT_NE(error(c).find("--prune_final_sparsity"), std::string::npos);
  c = Paper();
  c.csr_min_sparsity = 1.5;
  EXPECT_NE(error(c).find("--prune_csr_min_sparsity"), std::string::npos);
  c = Paper();
  c.start = -1;
  EXPECT_NE(error(c).find("--prune_start"), std::string::npos);
}

TEST(PruningSchedule, DynamismValidationChecksPruningOnlyWhenNamed) {
  absl::StatusOr<DynamismConfig> d = ParseDynamism("pruning");
  ASSERT_TRUE(d.ok());
  d->pruning.every = 0;
  EXPECT_FALSE(ValidateDynamismParameters(*d, 32).ok());
  absl::StatusOr<DynamismConfig> none = ParseDynamism("none");
  ASSERT_TRUE(none.ok());
  none->pruning.every = 0;
  EXPECT_TRUE(ValidateDynamismParameters(*none, 32).ok());
}

}  // namespace
}  // namespace dynmo::trainer
