// The re-shaping arithmetic of dynmo-train (trainer/layout/reshape_layout.h): where
// every rank sits in the new pp' x dp' grid, which layer copies get it its
// new stage's layers, in rounds that cannot deadlock, and the shapes it
// refuses. The brute-force checks replay the copies on sets of layer ids.
#include "trainer/layout/reshape_layout.h"

#include <set>
#include <vector>

#include "core/partition.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dynmo::trainer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Replays `step` on sets of layer ids: every copy's sender holds the layer
// when it sends; no rank is in two copies of one round; afterwards every
// rank holds exactly its new stage's layers, each received from a rank of
// the same replica (mod the old dp) that held it before.
void ExpectStepCarriesTheGrid(const ReshapeStep& step) {
  const int ranks = step.ranks();
  std::vector<std::set<int>> before(ranks), after(ranks);
  for (int p = 0; p < ranks; ++p) {
    const int i = p / step.from_dp;
    for (int l = step.from.boundaries[i]; l < step.from.boundaries[i + 1]; ++l) {
      before[p].insert(l);
    }
  }
  std::vector<std::set<int>> received(ranks);
  std::set<std::pair<int, int>> busy;  // (round, rank)
  int last_round = 0;
  for (const LayerCopy& c : step.copies) {
    ASSERT_GE(c.round, last_round) << "copies out of round order";
    last_round = c.round;
    ASSERT_TRUE(busy.insert({c.round, c.from_rank}).second)
        << "rank " << c.from_rank << " twice in round " << c.round;
    ASSERT_TRUE(busy.insert({c.round, c.to_rank}).second)
        << "rank " << c.to_rank << " twice in round " << c.round;
    ASSERT_TRUE(before[c.from_rank].count(c.layer))
        << "rank " << c.from_rank << " sends layer " << c.layer << " it never held";
    EXPECT_FALSE(before[c.to_rank].count(c.layer))
        << "rank " << c.to_rank << " is sent layer " << c.layer << " it holds";
    EXPECT_EQ(c.from_rank % step.from_dp, step.replica_after[c.to_rank] % step.from_dp)
        << "layer " << c.layer << " copied across replicas";
    EXPECT_TRUE(received[c.to_rank].insert(c.layer).second)
        << "rank " << c.to_rank << " receives layer " << c.layer << " twice";
  }
  EXPECT_EQ(step.rounds, step.copies.empty() ? 0 : last_round + 1);
  for (int p = 0; p < ranks; ++p) {
    const int stage = step.stage_after[p];
    EXPECT_EQ(stage, p / step.to_dp);
    EXPECT_EQ(step.replica_after[p], p % step.to_dp);
    std::set<int> want;
    for (int l = step.to.boundaries[stage]; l < step.to.boundaries[stage + 1]; ++l) {
      want.insert(l);
    }
    std::set<int> holds = received[p];
    for (int l : before[p]) {
      if (want.count(l)) holds.insert(l);
    }
    EXPECT_EQ(holds, want) << "rank " << p;
    EXPECT_EQ(step.first_layer_after[p], *want.begin());
    EXPECT_EQ(step.last_layer_after[p], *want.rbegin() + 1);
  }
}

TEST(ReshapeLayoutTest, FourStagesBecomeTwoStagesOfTwoReplicas) {
  absl::StatusOr<ReshapeStep> step = PlanReshapeStep(
      InitialLayout(4, {0, 2, 3, 5, 6}), /*dp=*/1, /*microbatches=*/4,
      ReshapeTarget{2, 2, {0, 3, 6}}, 6);
  ASSERT_TRUE(step.ok()) << step.status();
  ExpectStepCarriesTheGrid(*step);
  EXPECT_THAT(step->to.active_stages, ElementsAre(0, 1));
  EXPECT_EQ(step->to_microbatches, 2);
  // Rank 0 keeps 0,1 and gets 2 from rank 1; rank 1 (stage 0, replica 1)
  // keeps 2 and gets 0,1 from rank 0; rank 2 keeps 3,4 and gets 5 from rank
  // 3; rank 3 keeps 5 and gets 3,4 from rank 2.
  std::vector<std::tuple<int, int, int>> copies;
  for (const LayerCopy& c : step->copies) copies.emplace_back(c.layer, c.from_rank, c.to_rank);
  EXPECT_THAT(copies, ::testing::UnorderedElementsAre(
                          std::make_tuple(0, 0, 1), std::make_tuple(1, 0, 1),
                          std::make_tuple(2, 1, 0), std::make_tuple(3, 2, 3),
                          std::make_tuple(4, 2, 3), std::make_tuple(5, 3, 2)));
  // Pairs (0,1) and (2,3) exchange in parallel: 3 rounds of 2 copies.
  EXPECT_EQ(step->rounds, 3);
}

TEST(ReshapeLayoutTest, TwoReplicasBecomeAFourStagePipeline) {
  absl::StatusOr<ReshapeStep> step = PlanReshapeStep(
      InitialLayout(2, {0, 3, 6}), /*dp=*/2, /*microbatches=*/2,
      ReshapeTarget{4, 1, {}}, 6);
  ASSERT_TRUE(step.ok()) << step.status();
  ExpectStepCarriesTheGrid(*step);
  EXPECT_THAT(step->to.boundaries, ElementsAre(0, 2, 4, 5, 6));  // uniform
  EXPECT_EQ(step->to_microbatches, 4);
  // Every new stage reads from replica 0 of the old layout.
  for (const LayerCopy& c : step->copies) EXPECT_EQ(c.from_rank % 2, 0);
}

TEST(ReshapeLayoutTest, OneStageOfTwoBecomesTwoReplicasOfTheWholeModel) {
  absl::StatusOr<ReshapeStep> step = PlanReshapeStep(
      InitialLayout(2, {0, 4, 6}), 1, 4, ReshapeTarget{1, 2, {}}, 6);
  ASSERT_TRUE(step.ok()) << step.status();
  ExpectStepCarriesTheGrid(*step);
  EXPECT_THAT(step->to.boundaries, ElementsAre(0, 6));
  EXPECT_EQ(step->copies.size(), 6u);  // each rank gets the other's layers
}

TEST(ReshapeLayoutTest, ARePackedJobReshapesOverItsRunningStages) {
  // Stages 0 and 3 of 4 were released: ranks are positions among stages 1, 2.
  const StageLayout running{{1, 2}, {0, 5, 10}};
  absl::StatusOr<ReshapeStep> step = PlanReshapeStep(running, 2, 2, ReshapeTarget{1, 4, {}}, 10);
  ASSERT_TRUE(step.ok()) << step.status();
  ExpectStepCarriesTheGrid(*step);
  EXPECT_THAT(step->to.active_stages, ElementsAre(0));
  EXPECT_EQ(step->to_microbatches, 1);
}

TEST(ReshapeLayoutTest, ManyShapesCarryTheGrid) {
  const int layers = 12;
  for (int old_pp : {1, 2, 3, 4, 6}) {
    for (int old_dp : {1, 2, 3}) {
      const int ranks = old_pp * old_dp;
      for (int new_pp = 1; new_pp <= ranks; ++new_pp) {
        if (ranks % new_pp != 0 || new_pp > layers) continue;
        absl::StatusOr<ReshapeStep> step = PlanReshapeStep(
            InitialLayout(old_pp, core::PartitionUniform(layers, old_pp)), old_dp,
            /*microbatches=*/12, ReshapeTarget{new_pp, ranks / new_pp, {}}, layers);
        ASSERT_TRUE(step.ok()) << step.status();
        SCOPED_TRACE(testing::Message() << old_pp << "x" << old_dp << " -> " << new_pp
                                        << "x" << ranks / new_pp);
        ExpectStepCarriesTheGrid(*step);
      }
    }
  }
}

TEST(ReshapeLayoutTest, ShapesThatDoNotFitAreRefused) {
  const StageLayout four = InitialLayout(4, {0, 2, 3, 5, 6});
  auto refused = [&](int dp, int microbatches, ReshapeTarget t) {
    absl::StatusOr<ReshapeStep> step = PlanReshapeStep(four, dp, microbatches, t, 6);
    EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(step.status().message());
  };
  EXPECT_THAT(refused(1, 4, {2, 1, {0, 3, 6}}), HasSubstr("needs 2 ranks but the job runs on 4"));
  EXPECT_THAT(refused(1, 4, {0, 4, {}}), HasSubstr("must be >= 1"));
  EXPECT_THAT(refused(1, 4, {2, 2, {0, 3, 4, 6}}), HasSubstr("boundaries 0,3,4,6"));
  EXPECT_THAT(refused(1, 4, {2, 2, {0, 6, 6}}), HasSubstr("boundaries 0,6,6"));
  EXPECT_THAT(refused(1, 3, {1, 4, {}}), HasSubstr("3 micro-batches"));
  // More stages than layers.
  EXPECT_THAT(refused(2, 4, {8, 1, {}}), HasSubstr("8 stages for 6 layers"));
}

TEST(ReshapeLayoutTest, ParsesTheTestPolicySyntax) {
  absl::StatusOr<ReshapeAt> at = ParseReshapeAt("7:2x2:0,3,6");
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(at->iteration, 7);
  EXPECT_EQ(at->target.pp, 2);
  EXPECT_EQ(at->target.dp, 2);
  EXPECT_THAT(at->target.boundaries, ElementsAre(0, 3, 6));
  at = ParseReshapeAt("3:1x4");
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_TRUE(at->target.boundaries.empty());
  for (const char* bad : {"", "3", "0:2x2", "x:2x2", "3:2", "3:2x", "3:0x4", "3:2x2:a",
                          "3:2x2:0,3:6"}) {
    EXPECT_EQ(ParseReshapeAt(bad).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

}  // namespace
}  // namespace dynmo::trainer
