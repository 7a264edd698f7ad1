// Cost model and measures: stage time with speeds and link, replica
// combination, imbalance, lower bounds, predicted bubble ratio.
#include "core/measures.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/partition.h"

namespace dynmo::core {
namespace {

PipelineModel Model(const std::vector<double>& times, int stages) {
  PipelineModel m;
  for (size_t i = 0; i < times.size(); ++i) {
    LayerCost l;
    l.id = static_cast<int>(i);
    l.fwd_s = times[i] / 4;
    l.bwd_s = times[i] / 2;
    l.wgrad_s = times[i] / 4;
    l.resident_bytes = 8;
    l.activation_bytes = 2;
    m.layers.push_back(l);
  }
  m.stages.assign(stages, StageSpec{});
  return m;
}

TEST(StageLoads, DivideBySpeedAndAddExposedTransferExceptLastStage) {
  PipelineModel m = Model({4, 4, 4, 4}, 2);
  m.stages[1].speed = 2;
  m.link = {/*boundary_bytes=*/100, /*bandwidth=*/50, /*overlapped=*/false};
  EXPECT_EQ(StageLoads(m, Boundaries{0, 2, 4}), (std::vector<double>{8 + 2, 4}));
  m.link.overlapped = true;
  EXPECT_EQ(StageLoads(m, Boundaries{0, 2, 4}), (std::vector<double>{8, 4}));
}

TEST(StageMemoryUse, CountsInflightActivations) {
  PipelineModel m = Model({1, 1, 1}, 2);
  m.stages[0].inflight_microbatches = 2;
  EXPECT_EQ(StageMemoryUse(m, Boundaries{0, 2, 3}),
            (std::vector<int64_t>{2 * 8 + 2 * 2 * 2, 8}));
}

TEST(Imbalance, IsMaxMinusMinOverMean) {
  EXPECT_DOUBLE_EQ(Imbalance(std::vector<double>{1, 2, 3}), 1.0);
  EXPECT_EQ(Imbalance(std::vector<double>{2, 2}), 0.0);
  EXPECT_EQ(Imbalance(std::vector<double>{0, 0}), 0.0);
  EXPECT_EQ(Imbalance(std::vector<double>{}), 0.0);
}

TEST(BottleneckLowerBound, NeverExceedsTheOptimum) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> t(0, 5), v(0.5, 2);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<double> times(1 + trial % 12);
    for (double& x : times) x = t(rng);
    PipelineModel m = Model(times, 1 + trial % static_cast<int>(times.size()));
    for (auto& s : m.stages) s.speed = v(rng);
    auto opt = OptimalBottleneck(m);
    ASSERT_TRUE(opt.ok());
    EXPECT_LE(BottleneckLowerBound(m), *opt * (1 + 1e-12));
  }
}

TEST(BottleneckLowerBound, IsTightForEqualLayers) {
  PipelineModel m = Model(std::vector<double>(8, 1), 4);
  EXPECT_DOUBLE_EQ(BottleneckLowerBound(m), 2.0);
  EXPECT_DOUBLE_EQ(*OptimalBottleneck(m), 2.0);
}

TEST(CombineReplicaProfiles, TakesTheSlowestReplicaPerField) {
  std::vector<std::vector<LayerCost>> replicas(2, std::vector<LayerCost>(2));
  replicas[0][0].fwd_s = 1;
  replicas[1][0].fwd_s = 3;
  replicas[0][1].wgrad_s = 5;
  replicas[1][1].resident_bytes = 7;
  auto c = CombineReplicaProfiles(replicas);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[0].fwd_s, 3);
  EXPECT_EQ((*c)[1].wgrad_s, 5);
  EXPECT_EQ((*c)[1].resident_bytes, 7);
}

TEST(CombineReplicaProfiles, RejectsMismatchedLayerCounts) {
  std::vector<std::vector<LayerCost>> replicas = {std::vector<LayerCost>(2),
                                                  std::vector<LayerCost>(3)};
  auto c = CombineReplicaProfiles(replicas);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("replica 1"), std::string::npos);
  EXPECT_FALSE(CombineReplicaProfiles({}).ok());
}

TEST(ValidateModel, NamesTheBadStage) {
  PipelineModel m = Model({1, 1}, 2);
  m.stages[1].speed = 0;
  absl::Status st = ValidateModel(m);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("stage 1"), std::string::npos);
}

TEST(PredictedBubbleRatio, MatchesOneFOneBClosedFormForEqualStages) {
  PipelineModel m = Model(std::vector<double>(8, 1), 4);
  const int microbatches = 8, p = 4;
  auto r = PredictedBubbleRatio(m, PartitionUniform(8, 4), Schedule::k1F1B,
                                microbatches);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(*r, double(p - 1) / (microbatches + p - 1), 1e-12);
}

TEST(PredictedBubbleRatio, GrowsWithImbalance) {
  PipelineModel m = Model(std::vector<double>(8, 1), 4);
  auto balanced = PredictedBubbleRatio(m, Boundaries{0, 2, 4, 6, 8}, Schedule::k1F1B, 8);
  auto skewed = PredictedBubbleRatio(m, Boundaries{0, 5, 6, 7, 8}, Schedule::k1F1B, 8);
  ASSERT_TRUE(balanced.ok() && skewed.ok());
  EXPECT_GT(*skewed, *balanced);
}

TEST(StageBusyTimesFor, AddUpToTheStageLoadsWithExchangesAndAnExposedLink) {
  PipelineModel m = Model({4, 4, 4, 4}, 2);
  m.stages[0].exchange_s = 1;
  m.stages[1].speed = 2;
  m.stages[1].exchange_s = 2;
  m.link = {/*boundary_bytes=*/100, /*bandwidth=*/50, /*overlapped=*/false};
  const Boundaries b{0, 2, 4};
  const std::vector<StagePassTimes> busy = StageBusyTimesFor(m, b);
  const std::vector<double> loads = StageLoads(m, b);
  ASSERT_EQ(busy.size(), 2u);
  for (size_t s = 0; s < busy.size(); ++s) {
    EXPECT_DOUBLE_EQ(busy[s].fwd_s + busy[s].bwd_s + busy[s].wgrad_s, loads[s]) << s;
  }
  EXPECT_DOUBLE_EQ(busy[0].wgrad_s, StagePassTimesFor(m, b)[0].wgrad_s);
}

TEST(PredictedIterationTime, MatchesOneFOneBClosedFormForEqualStages) {
  PipelineModel m = Model(std::vector<double>(8, 1), 4);
  auto t = PredictedIterationTime(m, PartitionUniform(8, 4), Schedule::k1F1B, 8);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_NEAR(*t, (8 + 4 - 1) * 2.0, 1e-12);  // (m + p - 1) x a stage's F+B+W
}

// A plan's worth in step time is less than its worth in the slowest stage:
// the fill and drain run every stage once whatever the split. 9:1 -> 5:5
// over 2 stages and 8 micro-batches gains 80% in the bottleneck, and in the
// iteration 72 / 45 - 1 = 60%: skewed, the heavy stage is busy throughout
// (8 x 9, the light one's passes fit its gaps); balanced, (m + p - 1) x 5.
TEST(PredictedIterationTime, PricesTheFillAndDrainTheBottleneckLeavesOut) {
  PipelineModel m = Model(std::vector<double>(10, 1), 2);
  auto skewed = PredictedIterationTime(m, Boundaries{0, 9, 10}, Schedule::k1F1B, 8);
  auto balanced = PredictedIterationTime(m, Boundaries{0, 5, 10}, Schedule::k1F1B, 8);
  ASSERT_TRUE(skewed.ok() && balanced.ok());
  EXPECT_NEAR(*skewed, 8 * 9, 1e-9);
  EXPECT_NEAR(*balanced, 7 * 5 + 10, 1e-9);
  EXPECT_NEAR(Bottleneck(StageLoads(m, Boundaries{0, 9, 10})) /
                  Bottleneck(StageLoads(m, Boundaries{0, 5, 10})) - 1,
              0.8, 1e-12);
}

TEST(PredictedIterationTime, RefusesWhatTheSimulatorRefuses) {
  PipelineModel m = Model(std::vector<double>(4, 1), 2);
  EXPECT_FALSE(PredictedIterationTime(m, Boundaries{0, 2, 4}, Schedule::k1F1B, 0).ok());
}

TEST(Summarize, ReportsAllMeasures) {
  PipelineModel m = Model({1, 2, 3, 4}, 2);
  PartitionSummary s = Summarize(m, Boundaries{0, 3, 4});
  EXPECT_EQ(s.loads, (std::vector<double>{6, 4}));
  EXPECT_EQ(s.bottleneck, 6);
  EXPECT_DOUBLE_EQ(s.imbalance, 2.0 / 5.0);
  EXPECT_DOUBLE_EQ(s.lower_bound, 5.0);
  EXPECT_EQ(s.memory_bytes, (std::vector<int64_t>{24, 8}));
}

}  // namespace
}  // namespace dynmo::core
