// Migration plans: exactly the layers whose owner changes, their bytes, and
// rounds in which no stage is in two transfers.
#include "core/migration.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "core/partition.h"

namespace dynmo::core {
namespace {

std::vector<LayerCost> Layers(int n) {
  std::vector<LayerCost> out(n);
  for (int i = 0; i < n; ++i) {
    out[i].id = i;
    out[i].resident_bytes = 10 * (i + 1);
  }
  return out;
}

TEST(PlanMigration, ListsExactlyTheLayersThatChangeOwner) {
  auto plan = PlanMigrationBetween(Layers(8), Boundaries{0, 2, 4, 6, 8},
                                   Boundaries{0, 3, 4, 5, 8});
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->migrations.size(), 2u);
  std::map<int, std::pair<int, int>> moves;
  for (const auto& m : plan->migrations) moves[m.layer] = {m.from_stage, m.to_stage};
  EXPECT_EQ(moves[2], std::make_pair(1, 0));
  EXPECT_EQ(moves[5], std::make_pair(2, 3));
  EXPECT_EQ(plan->total_bytes, 30 + 60);
}

TEST(PlanMigration, IdenticalPartitionsMoveNothing) {
  auto plan = PlanMigrationBetween(Layers(4), Boundaries{0, 1, 4},
                                   Boundaries{0, 1, 4});
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->migrations.empty());
  EXPECT_EQ(plan->total_bytes, 0);
  EXPECT_EQ(plan->rounds, 0);
}

TEST(PlanMigration, NoStageTakesPartInTwoTransfersPerRound) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 500; ++trial) {
    const int n = 4 + trial % 30, k = 2 + trial % 6;
    if (k > n) continue;
    auto random_partition = [&] {
      std::vector<int> cuts(n - 1);
      for (int i = 0; i < n - 1; ++i) cuts[i] = i + 1;
      std::shuffle(cuts.begin(), cuts.end(), rng);
      Boundaries b(cuts.begin(), cuts.begin() + (k - 1));
      b.push_back(0);
      b.push_back(n);
      std::sort(b.begin(), b.end());
      return b;
    };
    const Boundaries from = random_partition(), to = random_partition();
    auto plan = PlanMigrationBetween(Layers(n), from, to);
    ASSERT_TRUE(plan.ok());
    std::map<int, std::set<int>> busy;  // round -> stages
    int last_round = 0;
    for (const auto& m : plan->migrations) {
      EXPECT_GE(m.round, last_round) << "not sorted by round";
      last_round = m.round;
      EXPECT_TRUE(busy[m.round].insert(m.from_stage).second);
      EXPECT_TRUE(busy[m.round].insert(m.to_stage).second);
      EXPECT_EQ(StageOfLayer(from, m.layer), m.from_stage);
      EXPECT_EQ(StageOfLayer(to, m.layer), m.to_stage);
    }
    // Applying the moves yields the target assignment.
    std::vector<int> owner = LayerOwners(from);
    for (const auto& m : plan->migrations) owner[m.layer] = m.to_stage;
    EXPECT_EQ(owner, LayerOwners(to));
  }
}

TEST(PlanMigration, RejectsMismatchedOwnerMaps) {
  EXPECT_FALSE(PlanMigration(Layers(3), {0, 0}, {0, 0, 1}).ok());
  EXPECT_FALSE(PlanMigrationBetween(Layers(3), Boundaries{0, 3},
                                    Boundaries{0, 1, 3}).ok());
}

TEST(LayerOwners, MapsRangesToGivenStageIds) {
  EXPECT_EQ(LayerOwners(Boundaries{0, 2, 3}, std::vector<int>{5, 7}),
            (std::vector<int>{5, 5, 7}));
}

}  // namespace
}  // namespace dynmo::core
