// Replay bounds: the delayed oracle, the release lower bound and the reshape
// ceiling are what the replay's own runs never beat.
#include "coordinator/job/replay_bounds.h"

#include <vector>

#include "core/partition.h"
#include "coordinator/job/job_replay.h"
#include "gtest/gtest.h"

namespace dynmo::service {
namespace {

// 16 layers; from iteration `step` the first four cost four times as much.
core::Trace StepTrace(int records, int step) {
  core::Trace trace;
  for (int i = 0; i < records; ++i) {
    core::TraceRecord r;
    r.iter = i;
    for (int l = 0; l < 16; ++l) {
      const double base = (i >= step && l < 4 ? 4.0 : 1.0) * 0.01;
      r.layers.push_back({base, 2 * base, 0, 64 << 20});
    }
    trace.push_back(std::move(r));
  }
  return trace;
}

// 16 layers whose last half shrinks to 1% of its cost from iteration
// `shrink` (a pruned or frozen half): fewer stages then keep the speed.
core::Trace ShrinkTrace(int records, int shrink) {
  core::Trace trace;
  for (int i = 0; i < records; ++i) {
    core::TraceRecord r;
    r.iter = i;
    for (int l = 0; l < 16; ++l) {
      const double base = (i >= shrink && l >= 8 ? 0.01 : 1.0) * 0.01;
      r.layers.push_back({base, 2 * base, 0, 64 << 20});
    }
    trace.push_back(std::move(r));
  }
  return trace;
}

JobReplayConfig Config() {
  JobReplayConfig c;
  c.pp = 4;
  c.microbatches = 8;
  c.migration_bandwidth_bytes_per_s = 10e9;
  c.oracle = true;
  return c;
}

TEST(ReplayBoundsTest, TheDelayedOracleWithoutALeadIsTheOracle) {
  JobReplayConfig c = Config();
  c.options.plan_lead_iterations = 0;
  absl::StatusOr<JobReplayResult> r = ReplayJob(StepTrace(60, 20), c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->delayed_oracle_total_s, r->oracle_total_s);

  c.options.plan_lead_iterations = 10;  // ten records after the step on the old optimum
  r = ReplayJob(StepTrace(60, 20), c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->delayed_oracle_total_s, r->oracle_total_s * 1.05);
  EXPECT_LT(r->delayed_oracle_total_s, r->static_total_s);
  EXPECT_GE(r->delayed_oracle_speedup, r->speedup) << "auto follows one step no faster";
  EXPECT_FALSE(r->release_bound.has_value());  // no re-packing
  EXPECT_FALSE(r->reshape_bound.has_value());
}

TEST(ReplayBoundsTest, NoReleaseSpendsFewerGpuHoursThanTheBound) {
  JobReplayConfig c = Config();
  c.options.default_policy.repack = true;
  c.options.default_policy.elastic = Elastic::kRelease;
  absl::StatusOr<JobReplayResult> r = ReplayJob(ShrinkTrace(120, 20), c);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->release_bound.has_value());
  const ReleaseBound& b = *r->release_bound;
  EXPECT_DOUBLE_EQ(b.static_gpu_s, r->static_gpu_s);
  EXPECT_LT(r->dynamic_gpu_s, r->static_gpu_s) << "the replay released stages";
  ASSERT_GE(r->speedup, 0.98);  // so the bound applies to it
  EXPECT_LE(b.min_gpu_s, r->dynamic_gpu_s * (1 + 1e-9));
  EXPECT_LT(b.fraction, 0.75) << "half the work left: half the stages would do";
  EXPECT_GT(b.fraction, 0.2);
}

TEST(ReplayBoundsTest, AJobThatNeedsEveryStageCannotRelease) {
  ElasticBoundsInput in;
  in.pp = 4;
  in.spec.global_microbatches = 8;
  for (int t = 0; t < 10; ++t) {
    std::vector<core::LayerCost> layers(8);
    for (int i = 0; i < 8; ++i) layers[static_cast<size_t>(i)] = {i, 0.01};
    in.records.push_back(layers);
    absl::StatusOr<core::ShapeCost> s =
        core::CostOfGrid(layers, in.spec, core::Grid{4, 1, core::PartitionUniform(8, 4)});
    ASSERT_TRUE(s.ok()) << s.status();
    in.static_iteration_s.push_back(s->iteration_s);
  }
  absl::StatusOr<ReleaseBound> b = ReleaseGpuSecondsBound(in);
  ASSERT_TRUE(b.ok()) << b.status();
  // One stage spends fewer GPU-seconds (no bubbles) but is ~3x slower: the
  // 2% of time the share allows buys almost nothing.
  EXPECT_GT(b->fraction, 0.99);
  EXPECT_LE(b->fraction, 1.0 + 1e-12);
}

TEST(ReplayBoundsTest, NoReshapeIsFasterThanItsCeiling) {
  JobReplayConfig c = Config();
  c.options.default_policy.repack = true;
  c.options.default_policy.elastic = Elastic::kReshape;
  absl::StatusOr<JobReplayResult> r = ReplayJob(ShrinkTrace(120, 20), c);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->reshape_bound.has_value());
  const ReshapeBound& b = *r->reshape_bound;
  EXPECT_GE(b.speedup, r->speedup - 1e-9);
  EXPECT_GT(b.speedup, 1.0);
  // The last tenth: 12 records.
  double static_tail = 0, dynamic_tail = 0;
  for (size_t i = 108; i < 120; ++i) {
    static_tail += r->static_iteration_s[i];
    dynamic_tail += r->dynamic_iteration_s[i];
  }
  EXPECT_EQ(TailStart(120, 0.1), 108);
  EXPECT_GE(b.tail_speedup, static_tail / dynamic_tail - 1e-9);
}

TEST(ReplayBoundsTest, InputsThatDisagreeAreErrors) {
  ElasticBoundsInput in;
  in.pp = 2;
  in.records.push_back(std::vector<core::LayerCost>(4));
  EXPECT_FALSE(ReleaseGpuSecondsBound(in).ok());  // no static time
  in.static_iteration_s.push_back(1.0);
  in.min_throughput_share = 0;
  EXPECT_FALSE(ReleaseGpuSecondsBound(in).ok());
  in.min_throughput_share = 0.98;
  in.tail_fraction = 2;
  EXPECT_FALSE(ReshapeSpeedBound(in).ok());
  in.tail_fraction = 0.1;
  in.rank_speeds.push_back({1.0});  // one speed for two ranks
  EXPECT_FALSE(ReshapeSpeedBound(in).ok());
  in.pp = 0;
  EXPECT_FALSE(ReleaseGpuSecondsBound(in).ok());
}

}  // namespace
}  // namespace dynmo::service
