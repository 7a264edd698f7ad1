// The re-packing arithmetic of dynmo-train (trainer/layout/repack_layout.h): which
// current rank becomes which, where a released stage's layers go, and the
// test-policy syntax that asks for fewer stages.
#include "trainer/layout/repack_layout.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dynmo::trainer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(RepackLayoutTest, ReleasingTheOuterStagesRenumbersTheMiddleOnesFromZero) {
  const StageLayout from = InitialLayout(4, {0, 1, 2, 4, 6});
  absl::StatusOr<RepackStep> step =
      PlanRepackStep(from, StageLayout{{1, 2}, {0, 3, 6}}, 6, /*dp=*/1);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_TRUE(step->releases());
  EXPECT_THAT(step->new_index, ElementsAre(-1, 0, 1, -1));
  EXPECT_THAT(step->new_rank, ElementsAre(-1, 0, 1, -1));
  // Released stages keep empty ranges where they sat.
  EXPECT_THAT(step->expanded_to, ElementsAre(0, 0, 3, 6, 6));
  EXPECT_THAT(step->owner_before, ElementsAre(0, 1, 2, 2, 3, 3));
  EXPECT_THAT(step->owner_after, ElementsAre(1, 1, 1, 2, 2, 2));
}

TEST(RepackLayoutTest, DataParallelReplicasOfAReleasedStageAllLeave) {
  const StageLayout from = InitialLayout(3, {0, 2, 4, 6});
  absl::StatusOr<RepackStep> step =
      PlanRepackStep(from, StageLayout{{0, 2}, {0, 4, 6}}, 6, /*dp=*/2);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_THAT(step->new_rank, ElementsAre(0, 1, -1, -1, 2, 3));
  EXPECT_THAT(step->expanded_to, ElementsAre(0, 4, 4, 6));
}

TEST(RepackLayoutTest, ASecondRepackIsRelativeToTheRunningStages) {
  const StageLayout running{{1, 2, 3}, {0, 2, 4, 6}};
  absl::StatusOr<RepackStep> step =
      PlanRepackStep(running, StageLayout{{3}, {0, 6}}, 6, 1);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_THAT(step->new_rank, ElementsAre(-1, -1, 0));
  EXPECT_THAT(step->expanded_to, ElementsAre(0, 0, 0, 6));
}

TEST(RepackLayoutTest, SameStagesIsAPlainMigration) {
  const StageLayout from = InitialLayout(2, {0, 1, 6});
  absl::StatusOr<RepackStep> step =
      PlanRepackStep(from, StageLayout{{0, 1}, {0, 5, 6}}, 6, 1);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_FALSE(step->releases());
  EXPECT_THAT(step->new_rank, ElementsAre(0, 1));
  EXPECT_THAT(step->expanded_to, ElementsAre(0, 5, 6));
}

TEST(RepackLayoutTest, StagesThatAreNotRunningOrOutOfOrderAreRefused) {
  const StageLayout running{{1, 2}, {0, 3, 6}};
  EXPECT_THAT(PlanRepackStep(running, StageLayout{{0}, {0, 6}}, 6, 1).status().message(),
              HasSubstr("not a subsequence"));
  EXPECT_THAT(
      PlanRepackStep(running, StageLayout{{2, 1}, {0, 3, 6}}, 6, 1).status().message(),
      HasSubstr("not a subsequence"));
  EXPECT_FALSE(PlanRepackStep(running, StageLayout{{1}, {0, 3, 6}}, 6, 1).ok());
  EXPECT_FALSE(PlanRepackStep(running, StageLayout{{}, {0, 6}}, 6, 1).ok());
}

TEST(RepackLayoutTest, TargetSyntaxNamesStagesBeforeTheAt) {
  absl::StatusOr<LayoutTarget> t = ParseLayoutTarget("1,2@0,3,6");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT(t->active_stages, ElementsAre(1, 2));
  EXPECT_THAT(t->boundaries, ElementsAre(0, 3, 6));
  absl::StatusOr<LayoutTarget> plain = ParseLayoutTarget("0,3,6");
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->active_stages.empty());
  EXPECT_THAT(ResolveTarget(StageLayout{{1, 2}, {0, 1, 6}}, *plain).active_stages,
              ElementsAre(1, 2));
  EXPECT_FALSE(ParseLayoutTarget("a@0,6").ok());
  EXPECT_FALSE(ParseLayoutTarget("@0,6").ok());
}

}  // namespace
}  // namespace dynmo::trainer
