// Re-shaping: grid costs against 1F1B's closed form and the ring all-reduce
// formula, copy bytes against a brute force over positions, memory caps,
// the order of feasible grids, and refusals.
#include "core/reshape.h"

#include <gtest/gtest.h>

#include <random>

#include "core/partition.h"

namespace dynmo::core {
namespace {

std::vector<LayerCost> Layers(const std::vector<double>& times, int64_t params = 0,
                              int64_t bytes = 100) {
  std::vector<LayerCost> out;
  for (size_t i = 0; i < times.size(); ++i) {
    LayerCost l;
    l.id = static_cast<int>(i);
    l.fwd_s = times[i] / 3;
    l.bwd_s = times[i] / 3;
    l.wgrad_s = times[i] / 3;
    l.params = params;
    l.resident_bytes = bytes;
    out.push_back(l);
  }
  return out;
}

ShapeSpec Spec(int g) {
  ShapeSpec s;
  s.global_microbatches = g;
  return s;
}

TEST(CostOfShape, EqualLayersMatchTheOneFOneBClosedForm) {
  // 8 unit layers on 4 ranks, 8 micro-batches: p x d runs m = 8/d through
  // p stages of 8/p each: (m + p - 1) * 8/p.
  const auto layers = Layers(std::vector<double>(8, 1.0));
  const Grid from{4, 1, {0, 2, 4, 6, 8}};
  for (int p : {1, 2, 4}) {
    const int d = 4 / p;
    auto cost = CostOfShape(layers, Spec(8), from, p, d);
    ASSERT_TRUE(cost.ok()) << cost.status();
    const double m = 8.0 / d;
    EXPECT_NEAR(cost->pipeline_s, (m + p - 1) * 8.0 / p, 1e-9) << p;
    EXPECT_EQ(cost->allreduce_s, 0);
    EXPECT_NEAR(cost->tokens_per_s, 8 / cost->iteration_s, 1e-12);
  }
}

TEST(CostOfShape, RingAllReduceOfTheHeaviestStageIsExposedBeyondTheOverlap) {
  // 4 layers of 1,000 parameters (4 bytes each) on 2 x 2: each stage holds
  // 2,000 params = 8,000 bytes; a ring over 2 moves 2 * 1/2 * 8,000 bytes.
  const auto layers = Layers(std::vector<double>(4, 1.0), 1000);
  ShapeSpec spec = Spec(4);
  spec.data_parallel.allreduce_bandwidth_bytes_per_s = 1000;
  spec.data_parallel.overlap = 0.25;
  auto cost = CostOfShape(layers, spec, Grid{4, 1, {0, 1, 2, 3, 4}}, 2, 2);
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_NEAR(cost->allreduce_s, 0.75 * 8.0, 1e-12);
  EXPECT_NEAR(cost->iteration_s, cost->pipeline_s + 6.0, 1e-12);
  // One replica: nothing to reduce.
  auto single = CostOfShape(layers, spec, Grid{4, 1, {0, 1, 2, 3, 4}}, 4, 1);
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->allreduce_s, 0);
}

TEST(ReshapeReceiveBytes, MatchesABruteForceOverLayerOwners) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 6 + static_cast<int>(rng() % 10);
    std::vector<LayerCost> layers = Layers(std::vector<double>(n, 1.0));
    for (auto& l : layers) l.resident_bytes = 1 + rng() % 1000;
    const int ranks = 4;
    auto random_grid = [&](int pp) {
      Grid g{pp, ranks / pp, {}};
      std::vector<double> w(n);
      for (double& x : w) x = 1 + rng() % 5;
      g.boundaries = *PartitionMinBottleneck(w, pp);
      return g;
    };
    const int pps[] = {1, 2, 4};
    const Grid from = random_grid(pps[rng() % 3]);
    const Grid to = random_grid(pps[rng() % 3]);
    const std::vector<int64_t> got = ReshapeReceiveBytes(layers, from, to);
    for (int p = 0; p < ranks; ++p) {
      int64_t want = 0;
      for (int l = 0; l < n; ++l) {
        const bool holds = StageOfLayer(from.boundaries, l) == p / from.dp;
        const bool needs = StageOfLayer(to.boundaries, l) == p / to.dp;
        if (needs && !holds) want += layers[l].resident_bytes;
      }
      EXPECT_EQ(got[p], want) << "trial " << trial << " position " << p;
    }
  }
}

TEST(CostOfShape, FourByOneToTwoByTwoCopiesHalfOfEachNewStage) {
  // Positions 0..3 held layers {0,1},{2,3},{4,5},{6,7}; as 2 x 2 positions
  // 0,1 hold 0..3 and 2,3 hold 4..7: each receives the other pair.
  const auto layers = Layers(std::vector<double>(8, 1.0), 0, 100);
  ShapeSpec spec = Spec(8);
  spec.data_parallel.copy_bandwidth_bytes_per_s = 50;
  auto cost = CostOfShape(layers, spec, Grid{4, 1, {0, 2, 4, 6, 8}}, 2, 2);
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_EQ(cost->boundaries, (Boundaries{0, 4, 8}));
  EXPECT_EQ(cost->copy_bytes, 4 * 200);
  EXPECT_NEAR(cost->copy_s, 200.0 / 50, 1e-12);
}

TEST(CostOfShape, MemoryCapsRuleOutShortPipelines) {
  // 8 layers of 100 bytes, 400 bytes per device: at least 2 stages.
  const auto layers = Layers(std::vector<double>(8, 1.0));
  ShapeSpec spec = Spec(8);
  spec.device.capacity_bytes = 400;
  const Grid from{4, 1, {0, 2, 4, 6, 8}};
  EXPECT_FALSE(CostOfShape(layers, spec, from, 1, 4).ok());
  auto shapes = FeasibleShapes(layers, spec, from);
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  ASSERT_EQ(shapes->size(), 2u);
  EXPECT_EQ(shapes->front().pp, 2);  // (4+1)*4 = 20 beats (8+3)*2 = 22
  EXPECT_EQ(shapes->back().pp, 4);
}

TEST(FeasibleShapes, FastestFirstAndEveryDivisorTried) {
  const auto layers = Layers(std::vector<double>(12, 1.0));
  const Grid from{6, 1, {0, 2, 4, 6, 8, 10, 12}};
  auto shapes = FeasibleShapes(layers, Spec(12), from);
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  EXPECT_EQ(shapes->size(), 4u);  // 1x6, 2x3, 3x2, 6x1
  for (size_t i = 1; i < shapes->size(); ++i) {
    EXPECT_GE((*shapes)[i - 1].tokens_per_s, (*shapes)[i].tokens_per_s);
  }
  EXPECT_EQ(shapes->front().pp, 1);
  // G = 4 does not split over 3 or 6 replicas: only 6x1 and 3x2 remain.
  auto fewer = FeasibleShapes(layers, Spec(4), from);
  ASSERT_TRUE(fewer.ok());
  EXPECT_EQ(fewer->size(), 2u);
}

TEST(CostOfGrid, KeepsTheGridsOwnBoundaries) {
  const auto layers = Layers({1, 1, 1, 5});
  auto cost = CostOfGrid(layers, Spec(4), Grid{2, 1, {0, 2, 4}});
  ASSERT_TRUE(cost.ok()) << cost.status();
  // Stage 1 (1 + 5) paces all 4 micro-batches; stage 0 (1 + 1) adds its
  // first forward and last backward once: 4 * 6 + 2.
  EXPECT_NEAR(cost->pipeline_s, 4 * 6.0 + 2.0, 1e-9);
  EXPECT_EQ(cost->copy_bytes, 0);
}

TEST(Reshape, BadInputIsRefusedWithAReason) {
  const auto layers = Layers(std::vector<double>(4, 1.0));
  const Grid from{2, 1, {0, 2, 4}};
  ShapeSpec spec = Spec(4);
  EXPECT_FALSE(CostOfShape(layers, spec, from, 3, 1).ok());  // 3 ranks of 2
  EXPECT_FALSE(CostOfShape(layers, spec, Grid{2, 1, {0, 3}}, 2, 1).ok());
  spec.data_parallel.overlap = 1.5;
  EXPECT_FALSE(CostOfShape(layers, spec, from, 1, 2).ok());
  spec = Spec(4);
  spec.data_parallel.allreduce_bandwidth_bytes_per_s = std::nan("");
  EXPECT_FALSE(FeasibleShapes(layers, spec, from).ok());
  spec = Spec(0);
  EXPECT_FALSE(CostOfGrid(layers, spec, from).ok());
  spec = Spec(3);  // 3 micro-batches over 2 replicas
  auto r = CostOfShape(layers, spec, from, 1, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("do not split"), std::string::npos);
  // Too many stages for the layers.
  EXPECT_FALSE(CostOfShape(Layers({1}), Spec(2), Grid{1, 2, {0, 1}}, 2, 1).ok());
}

TEST(CostOfShape, AGridIsPricedOnTheRanksItWouldRunOn) {
  // 4 ranks, the last at half speed. As 2 x 2, positions 2 and 3 (the slow
  // rank) make stage 1; stage 0 runs at full speed, so it takes twice the
  // work: 4 of 6 equal layers (4 vs 2 / 0.5).
  const auto layers = Layers(std::vector<double>(6, 1.0));
  const Grid from{4, 1, {0, 2, 3, 5, 6}};
  ShapeSpec spec = Spec(4);
  spec.rank_speeds = {1, 1, 1, 0.5};
  auto cost = CostOfShape(layers, spec, from, 2, 2);
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_EQ(cost->boundaries, (Boundaries{0, 4, 6}));
  // Priced as before, with every rank as slow as the slowest, the same grid
  // splits evenly and is twice as slow.
  ShapeSpec slowest = Spec(4);
  slowest.device.speed = 0.5;
  auto old = CostOfShape(layers, slowest, from, 2, 2);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->boundaries, (Boundaries{0, 3, 6}));
  EXPECT_LT(cost->iteration_s, old->iteration_s);
  // As 1 x 4 the one stage holds every rank and runs at the slowest's speed:
  // the same as pricing every rank at 0.5.
  auto one = CostOfShape(layers, spec, from, 1, 4);
  auto one_slow = CostOfShape(layers, slowest, from, 1, 4);
  ASSERT_TRUE(one.ok() && one_slow.ok());
  EXPECT_DOUBLE_EQ(one->iteration_s, one_slow->iteration_s);
}

TEST(CostOfShape, RankSpeedsOfTheWrongCountOrNotPositiveAreRefused) {
  const auto layers = Layers(std::vector<double>(4, 1.0));
  const Grid from{2, 1, {0, 2, 4}};
  ShapeSpec spec = Spec(4);
  spec.rank_speeds = {1, 1, 1};
  auto r = CostOfShape(layers, spec, from, 1, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("3 rank speeds for a grid of 2 ranks"),
            std::string::npos);
  EXPECT_FALSE(CostOfGrid(layers, spec, from).ok());
  spec.rank_speeds = {1, std::nan("")};
  EXPECT_FALSE(FeasibleShapes(layers, spec, from).ok());
  spec.rank_speeds = {1, 0};
  EXPECT_FALSE(CostOfGrid(layers, spec, from).ok());
}

}  // namespace
}  // namespace dynmo::core
