#include "core/cost_noise.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace dynmo::core {
namespace {

PipelineModel Uniform(int layers, int stages, double t) {
  PipelineModel m;
  for (int l = 0; l < layers; ++l) {
    LayerCost c;
    c.id = l;
    c.fwd_s = t;
    m.layers.push_back(c);
  }
  m.stages.assign(static_cast<size_t>(stages), StageSpec{});
  return m;
}

TEST(NoiseTrackerTest, ConstantSamplesHaveNoSpread) {
  NoiseTracker n;
  EXPECT_EQ(n.sd(), 0);
  for (int i = 0; i < 100; ++i) n.Add(0.25, 0.1);
  EXPECT_EQ(n.sd(), 0);
  EXPECT_EQ(n.samples(), 100);
}

TEST(NoiseTrackerTest, AlternatingSamplesConvergeToTheirSpread) {
  // x = 1 ± a alternately (population sd a). In steady state the mean
  // lags by ±w·a/(2−w), each sample deviates from it by 2a/(2−w), and the
  // variance settles at (1−w)·(2a/(2−w))²: 0.009972 for a = 0.1, w = 0.1.
  NoiseTracker n;
  for (int i = 0; i < 2000; ++i) n.Add(i % 2 == 0 ? 1.1 : 0.9, 0.1);
  EXPECT_NEAR(n.sd() * n.sd(), 0.9 * 0.04 / (1.9 * 1.9), 1e-9);
}

TEST(NoiseTrackerTest, ResetForgetsTheOldSpreadAndBadSamplesAreIgnored) {
  NoiseTracker n;
  for (int i = 0; i < 50; ++i) n.Add(i % 2 == 0 ? 2.0 : 1.0, 0.1);
  EXPECT_GT(n.sd(), 0.4);
  n.Reset(3.0);
  EXPECT_EQ(n.sd(), 0);
  EXPECT_EQ(n.samples(), 1);
  n.Add(std::numeric_limits<double>::quiet_NaN(), 0.1);
  n.Add(std::numeric_limits<double>::infinity(), 0.1);
  n.Add(4.0, 0);
  EXPECT_EQ(n.sd(), 0);
  EXPECT_EQ(n.samples(), 1);
  n.Add(5.0, 1.0);  // weight 1: only the newest sample counts
  EXPECT_EQ(n.sd(), 0);
}

TEST(NoiseTrackerTest, RecenterDropsTheSpreadAndKeepsTheCount) {
  NoiseTracker n;
  n.Recenter(1.0);  // nothing to recenter yet
  EXPECT_EQ(n.samples(), 0);
  n.Add(2.5, 0.1);
  n.Add(1.0, 0.1);
  EXPECT_GT(n.sd(), 0.4);
  n.Recenter(1.0);
  EXPECT_EQ(n.sd(), 0);
  EXPECT_EQ(n.samples(), 2);
  n.Recenter(std::numeric_limits<double>::quiet_NaN());  // ignored
  n.Add(1.0, 0.1);  // at the new mean: still no spread
  EXPECT_EQ(n.sd(), 0);
  EXPECT_EQ(n.samples(), 3);
  n.Add(2.0, 0.1);
  EXPECT_NEAR(n.sd() * n.sd(), 0.9 * 0.1 * 1.0, 1e-12);
}

TEST(SmoothedSdTest, ClosedForm) {
  EXPECT_DOUBLE_EQ(SmoothedSd(2.0, 1.0), 2.0);
  EXPECT_DOUBLE_EQ(SmoothedSd(2.0, 0.5), 2.0 * std::sqrt(0.5 / 1.5));
  EXPECT_EQ(SmoothedSd(0, 0.5), 0);
  EXPECT_EQ(SmoothedSd(1.0, 0), 0);
}

TEST(StageRelativeNoiseTest, ClosedFormAndBadSizes) {
  // 8 layers of 1 s, sd 0.1 each, 4 stages: a stage holds 2 s with sd
  // sqrt(2) * 0.1, relative 0.0707.
  const PipelineModel m = Uniform(8, 4, 1.0);
  const std::vector<double> sd(8, 0.1);
  EXPECT_NEAR(StageRelativeNoise(m, sd), std::sqrt(2.0) * 0.1 / 2, 1e-12);
  EXPECT_EQ(StageRelativeNoise(m, std::vector<double>(3, 0.1)), 0);
  EXPECT_EQ(StageRelativeNoise(Uniform(8, 4, 0.0), sd), 0);
}

TEST(GainNoiseTest, SumsTheBottleneckStagesLayerVariances) {
  // 6 equal layers; current 0,4,6 (bottleneck stage 0: layers 0-3),
  // candidate 0,3,6 (a tie; the first maximum, stage 0: layers 0-2).
  PipelineModel m = Uniform(6, 2, 1.0);
  std::vector<double> sd = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6};
  absl::StatusOr<double> g = GainNoise(m, sd, {0, 4, 6}, {0, 3, 6});
  ASSERT_TRUE(g.ok()) << g.status();
  const double cur = 0.01 + 0.04 + 0.09 + 0.16;
  const double cand = 0.01 + 0.04 + 0.09;
  EXPECT_NEAR(*g, std::sqrt(cur + cand), 1e-12);
}

TEST(GainNoiseTest, ASlowStageScalesItsVariance) {
  PipelineModel m = Uniform(2, 2, 1.0);
  m.stages[1].speed = 0.5;  // stage 1 takes twice as long: the bottleneck
  std::vector<double> sd = {0.1, 0.1};
  absl::StatusOr<double> g = GainNoise(m, sd, {0, 1, 2}, {0, 1, 2});
  ASSERT_TRUE(g.ok());
  EXPECT_NEAR(*g, std::sqrt(2 * 0.01 / 0.25), 1e-12);
}

TEST(GainNoiseTest, MismatchedSizesAreErrors) {
  PipelineModel m = Uniform(4, 2, 1.0);
  EXPECT_FALSE(GainNoise(m, std::vector<double>(3, 0.1), {0, 2, 4}, {0, 1, 4}).ok());
  EXPECT_FALSE(GainNoise(m, std::vector<double>(4, 0.1), {0, 2, 4}, {0, 5, 4}).ok());
  EXPECT_FALSE(GainNoise(m, std::vector<double>(4, 0.1), {0, 4}, {0, 1, 4}).ok());
}

// A re-shape's candidate is over another number of stages; its bottleneck's
// spread counts dp / dp' times (its time per original micro-batch).
TEST(GainNoiseTest, AReshapeCandidateIsOverItsOwnStagesAndScaled) {
  PipelineModel now = Uniform(6, 3, 1.0);  // 0,2,4,6
  PipelineModel two = Uniform(6, 2, 1.0);  // 0,3,6
  std::vector<double> sd = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6};
  const double cur = 0.01 + 0.04;            // stage 0 of 0,2,4,6 (a tie)
  const double cand = 0.01 + 0.04 + 0.09;    // stage 0 of 0,3,6
  absl::StatusOr<double> g = ReshapeGainNoise(now, two, sd, {0, 2, 4, 6}, {0, 3, 6}, 1.0);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_NEAR(*g, std::sqrt(cur + cand), 1e-12);
  g = ReshapeGainNoise(now, two, sd, {0, 2, 4, 6}, {0, 3, 6}, 1.5);  // dp 3 -> 2
  ASSERT_TRUE(g.ok());
  EXPECT_NEAR(*g, std::sqrt(cur + 2.25 * cand), 1e-12);
  // The same model and scale 1 is GainNoise.
  EXPECT_DOUBLE_EQ(*ReshapeGainNoise(now, now, sd, {0, 2, 4, 6}, {0, 1, 4, 6}, 1.0),
                   *GainNoise(now, sd, {0, 2, 4, 6}, {0, 1, 4, 6}));
  // The candidate's boundaries must fit its own stages, and the scale be > 0.
  EXPECT_FALSE(ReshapeGainNoise(now, two, sd, {0, 2, 4, 6}, {0, 2, 4, 6}, 1.0).ok());
  EXPECT_FALSE(ReshapeGainNoise(now, two, sd, {0, 2, 4, 6}, {0, 3, 6}, 0).ok());
  EXPECT_FALSE(ReshapeGainNoise(now, two, sd, {0, 2, 4, 6}, {0, 3, 6},
                                std::numeric_limits<double>::quiet_NaN())
                   .ok());
}

// A job of thousands of replicas keeps a tracker per (replica, layer): the
// restart flag lives in the padding (service.SixtyFourLargestJobsTest).
TEST(NoiseTrackerTest, ARestartIsRememberedWithoutGrowingTheTracker) {
  EXPECT_LE(sizeof(NoiseTracker), 24u);
  NoiseTracker t;
  t.Add(1.0, 0.1);
  EXPECT_FALSE(t.restarted());
  t.Restart(2.0);
  EXPECT_TRUE(t.restarted());
  EXPECT_EQ(t.samples(), 1);
  EXPECT_EQ(t.sd(), 0);
}


// One rank's five layers, 1 s each, for `n` reports: each layer scatters
// by `own` (relative sd, independent) and all five by `shared` together (a
// neighbour on the core). Returns the tracker's inflation.
double Inflation(double own, double shared, int n, uint32_t seed, int restart_at = -1) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0, 1);
  std::vector<NoiseTracker> layers(5);
  StageCorrelation stage;
  for (int it = 0; it < n; ++it) {
    const double common = shared * normal(rng);
    double sum = 0, var = 0;
    for (NoiseTracker& layer : layers) {
      const double t = 1 + common + own * normal(rng);
      layer.Add(t, 0.1);
      sum += t;
      var += layer.sd() * layer.sd();
    }
    stage.Add(sum, var, 0, 5, 0.1, it == restart_at);
  }
  return stage.inflation();
}

TEST(StageCorrelationTest, IndependentLayersAddUpAsIndependent) {
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    EXPECT_LT(Inflation(0.1, 0.0, 400, seed), 2.2) << "seed " << seed;
  }
}

TEST(StageCorrelationTest, LayersSlowedTogetherAddUpToTheirCount) {
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    EXPECT_GT(Inflation(0.02, 0.1, 400, seed), 3.0) << "seed " << seed;
    EXPECT_LE(Inflation(0.0, 0.1, 400, seed), 5.0) << "never above the layer count";
  }
}

TEST(StageCorrelationTest, SaysNothingUntilEnoughReportsAndStartsAgainOnARestart) {
  EXPECT_EQ(Inflation(0.02, 0.1, StageCorrelation::kMinSamples - 1, 1), 1.0);
  EXPECT_EQ(Inflation(0.02, 0.1, 400, 1, /*restart_at=*/395), 1.0);
  StageCorrelation stage;
  for (int it = 0; it < 50; ++it) stage.Add(it % 2 ? 6.0 : 4.0, 0.01, 0, 5, 0.1, false);
  EXPECT_EQ(stage.inflation(), 5.0) << "clamped to the layer count";
  stage.Add(5.0, 0.01, 1, 5, 0.1, false);  // other layers: a new stage
  EXPECT_EQ(stage.inflation(), 1.0);
  StageCorrelation quiet;
  for (int it = 0; it < 50; ++it) quiet.Add(5.0, 0.0, 0, 5, 0.1, false);
  EXPECT_EQ(quiet.inflation(), 1.0) << "no spread anywhere";
  quiet.Add(std::numeric_limits<double>::quiet_NaN(), 0.0, 0, 5, 0.1, false);
  EXPECT_EQ(quiet.inflation(), 1.0);
}

}  // namespace
}  // namespace dynmo::core
