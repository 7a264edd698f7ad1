#include "core/cost_profile.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace dynmo::core {
namespace {

LayerCost Sample(int layer, double t, int64_t resident = 100,
                 int64_t activation = 10) {
  LayerCost c;
  c.id = layer;
  c.fwd_s = t;
  c.bwd_s = 2 * t;
  c.wgrad_s = t;
  c.params = 7;
  c.resident_bytes = resident;
  c.activation_bytes = activation;
  return c;
}

// Every (replica, layer) of a 2-replica, 4-layer job reported once.
CostProfile Complete(double t = 0.01) {
  CostProfile p(2, 4, CostProfileOptions{});
  for (int r = 0; r < 2; ++r) {
    for (int l = 0; l < 4; ++l) EXPECT_TRUE(p.Add(r, Sample(l, t), false).ok());
  }
  return p;
}

PipelineShape TwoStages() {
  PipelineShape shape;
  shape.stages.resize(2);
  shape.boundaries = {0, 2, 4};
  shape.microbatches = 8;
  return shape;
}

TEST(CostProfileTest, NoModelUntilEveryReplicaReportedEveryLayer) {
  CostProfile p(2, 4, CostProfileOptions{});
  EXPECT_EQ(p.missing(), 8);
  for (int l = 0; l < 4; ++l) ASSERT_TRUE(p.Add(0, Sample(l, 0.01), false).ok());
  EXPECT_EQ(p.missing(), 4);
  absl::StatusOr<PipelineModel> m = p.Model(TwoStages());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("4 of 8"), absl::string_view::npos)
      << m.status();
  for (int l = 0; l < 4; ++l) ASSERT_TRUE(p.Add(1, Sample(l, 0.01), false).ok());
  EXPECT_EQ(p.missing(), 0);
  EXPECT_TRUE(p.Model(TwoStages()).ok());
}

// The model of a 1-replica, 1-layer profile.
LayerCost Only(const CostProfile& p) {
  PipelineShape shape;
  shape.stages.resize(1);
  shape.boundaries = {0, 1};
  absl::StatusOr<PipelineModel> m = p.Model(shape);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? m->layers[0] : LayerCost{};
}

TEST(CostProfileTest, FirstSampleIsTakenAsIsTheSecondKeepsTheSmallerBytesAreSmoothed) {
  CostProfile p(1, 1, CostProfileOptions{/*smoothing=*/0.5, 0.1});
  ASSERT_TRUE(p.Add(0, Sample(0, 0.10, 100), false).ok());
  EXPECT_DOUBLE_EQ(Only(p).fwd_s, 0.10);
  ASSERT_TRUE(p.Add(0, Sample(0, 0.20, 201), false).ok());
  const LayerCost c = Only(p);
  EXPECT_DOUBLE_EQ(c.fwd_s, 0.10);
  EXPECT_DOUBLE_EQ(c.bwd_s, 0.20);
  EXPECT_EQ(c.resident_bytes, 151);  // llround(150.5): bytes are smoothed as they come
  EXPECT_EQ(c.params, 7);
}

// From the third sample on, samples are smoothed in as they come: a cost
// that bursts every few iterations counts at its mean.
TEST(CostProfileTest, LaterSamplesAreSmoothedIn) {
  CostProfile p(1, 1, CostProfileOptions{/*smoothing=*/0.5, 0.1});
  for (double t : {0.10, 0.12, 0.14}) ASSERT_TRUE(p.Add(0, Sample(0, t), false).ok());
  EXPECT_DOUBLE_EQ(Only(p).fwd_s, 0.5 * 0.10 + 0.5 * 0.14);
  ASSERT_TRUE(p.Add(0, Sample(0, 0.40), false).ok());
  EXPECT_DOUBLE_EQ(Only(p).fwd_s, 0.5 * 0.12 + 0.5 * 0.40);
}

// A stall on the second sample (a 4.5x forward, as a warm-up hiccup
// recorded on the adapter's second iteration, which decided its first plan
// on a 1F1B run) moves no estimate: the first plan is not decided on it.
TEST(CostProfileTest, AStallOnTheSecondSampleMovesNoEstimate) {
  CostProfile p(1, 1, CostProfileOptions{/*smoothing=*/0.5, 0.1});
  ASSERT_TRUE(p.Add(0, Sample(0, 0.05), false).ok());
  ASSERT_TRUE(p.Add(0, Sample(0, 0.225), false).ok());
  EXPECT_DOUBLE_EQ(Only(p).fwd_s, 0.05);
  // A slow first sample (the warm-up iteration) gives way to the second.
  CostProfile q(1, 1, CostProfileOptions{/*smoothing=*/0.5, 0.1});
  ASSERT_TRUE(q.Add(0, Sample(0, 0.30), false).ok());
  ASSERT_TRUE(q.Add(0, Sample(0, 0.05), false).ok());
  EXPECT_DOUBLE_EQ(Only(q).fwd_s, 0.05);
}

// Nor does the warm-up pair leave a spread behind: the adapter's first
// iteration ran 2.5x its steady time, which as timing noise (an EWMA of
// weight 0.1) still read a third of the stage's time per micro-batch 14
// iterations on and held its first plan until iteration 46. The spread
// counts from the third sample, around the cost kept.
TEST(CostProfileTest, TheWarmUpPairLeavesNoSpread) {
  CostProfile p(1, 1, CostProfileOptions{/*smoothing=*/0.1, 0.1});
  ASSERT_TRUE(p.Add(0, Sample(0, 0.25), false).ok());
  ASSERT_TRUE(p.Add(0, Sample(0, 0.14), false).ok());
  EXPECT_EQ(p.LayerNoise()[0], 0.0);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(p.Add(0, Sample(0, 0.10), false).ok());
  // What scatters is the steady samples' approach from the kept 0.14 only.
  const double sd = p.LayerNoise()[0];
  EXPECT_GT(sd, 0.0);
  CostProfile before(1, 1, CostProfileOptions{/*smoothing=*/0.1, 0.1});
  ASSERT_TRUE(before.Add(0, Sample(0, 0.14), false).ok());
  ASSERT_TRUE(before.Add(0, Sample(0, 0.14), false).ok());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(before.Add(0, Sample(0, 0.10), false).ok());
  EXPECT_DOUBLE_EQ(sd, before.LayerNoise()[0]);
  // After a model change the pair rule does not apply: its samples count.
  ASSERT_TRUE(p.Add(0, Sample(0, 0.30), /*model_changed=*/true).ok());
  ASSERT_TRUE(p.Add(0, Sample(0, 0.10), false).ok());
  EXPECT_GT(p.LayerNoise()[0], 0.0);
}

TEST(CostProfileTest, AModelChangeReplacesTheEstimate) {
  CostProfile p(1, 1, CostProfileOptions{/*smoothing=*/0.5, 0.1});
  ASSERT_TRUE(p.Add(0, Sample(0, 0.10), false).ok());
  ASSERT_TRUE(p.Add(0, Sample(0, 0.40), /*model_changed=*/true).ok());
  EXPECT_DOUBLE_EQ(Only(p).fwd_s, 0.40);
  // Only the job's second sample keeps the smaller: after a change, later
  // samples are smoothed in (a change is followed at once).
  ASSERT_TRUE(p.Add(0, Sample(0, 0.30), false).ok());
  EXPECT_DOUBLE_EQ(Only(p).fwd_s, 0.35);
}

TEST(CostProfileTest, ReplicasCombineByTheSlowest) {
  CostProfile p = Complete(0.01);
  ASSERT_TRUE(p.Add(1, Sample(2, 0.05), /*model_changed=*/true).ok());
  absl::StatusOr<PipelineModel> m = p.Model(TwoStages());
  ASSERT_TRUE(m.ok());
  EXPECT_DOUBLE_EQ(m->layers[2].fwd_s, 0.05);
  EXPECT_DOUBLE_EQ(m->layers[1].fwd_s, 0.01);
}

TEST(CostProfileTest, StagesHoldTheInflightMicrobatchesOfTheSchedule) {
  CostProfile p = Complete();
  PipelineShape shape = TwoStages();
  EXPECT_EQ(p.Model(shape)->stages[0].inflight_microbatches, 2);  // min(8, 2)
  shape.schedule = Schedule::kGPipe;
  EXPECT_EQ(p.Model(shape)->stages[1].inflight_microbatches, 8);
}

TEST(CostProfileTest, UnexplainedMeasuredMemoryComesOffTheCap) {
  CostProfile p = Complete();
  PipelineShape shape = TwoStages();
  // Stage 0 predicted: 2 layers x (100 resident + 2 in flight x 10) = 240.
  shape.stages[0] = StageMemoryReport{/*capacity=*/1000, /*used=*/540};
  shape.stages[1] = StageMemoryReport{/*capacity=*/-1, /*used=*/5000};
  absl::StatusOr<PipelineModel> m = p.Model(shape);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->stages[0].capacity_bytes, 700);  // 1000 - (540 - 240)
  EXPECT_EQ(m->stages[1].capacity_bytes, -1);   // unknown stays unbounded
  // Boundaries that do not fit the stages leave the caps as reported.
  shape.boundaries = {0, 4};
  EXPECT_EQ(p.Model(shape)->stages[0].capacity_bytes, 1000);
}

TEST(CostProfileTest, LayerNoiseIsTheNoisiestReplicas) {
  CostProfile p = Complete(0.01);
  EXPECT_EQ(p.LayerNoise(), std::vector<double>(4, 0.0));
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(p.Add(1, Sample(3, i % 2 == 0 ? 0.01 : 0.02), false).ok());
  }
  const std::vector<double> sd = p.LayerNoise();
  EXPECT_EQ(sd[0], 0.0);
  EXPECT_GT(sd[3], 0.0);
}

TEST(CostProfileTest, OutOfRangeSamplesAreRefusedAndChangeNothing) {
  CostProfile p(2, 4, CostProfileOptions{});
  EXPECT_EQ(p.Add(2, Sample(0, 0.01), false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.Add(-1, Sample(0, 0.01), false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.Add(0, Sample(4, 0.01), false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.missing(), 8);
}

}  // namespace
}  // namespace dynmo::core
