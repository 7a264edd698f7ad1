// Elastic replay: the five modes on traces whose answers are known by hand —
// a model that never changes, one whose back half gets cheaper, one whose
// memory shrinks so a shorter pipeline fits — plus smoothing and refusals.
#include "core/elastic_replay.h"

#include <gtest/gtest.h>

namespace dynmo::core {
namespace {

// `iterations` records of layers with time t(k, layer) and bytes m(k, layer).
template <typename Time, typename Bytes>
Trace MakeTrace(int iterations, int layers, Time t, Bytes m) {
  Trace trace;
  for (int k = 0; k < iterations; ++k) {
    TraceRecord r;
    r.iter = k;
    for (int l = 0; l < layers; ++l) {
      TraceLayer tl;
      tl.fwd_s = t(k, l) / 3;
      tl.bwd_s = t(k, l) / 3;
      tl.wgrad_s = t(k, l) / 3;
      tl.mem_bytes = m(k, l);
      r.layers.push_back(tl);
    }
    trace.push_back(r);
  }
  return trace;
}

ElasticReplayConfig Config(int pp, int dp, int g) {
  ElasticReplayConfig c;
  c.pp = pp;
  c.dp = dp;
  c.spec.global_microbatches = g;
  c.trigger.kind = RebalanceTrigger::Kind::kEvery;
  c.trigger.every = 5;
  return c;
}

const ModeResult& Mode(const std::vector<ModeResult>& r, ElasticMode m) {
  return r[static_cast<int>(m)];
}

TEST(ReplayElastic, AnUnchangingModelChangesNothingInAnyMode) {
  const Trace trace = MakeTrace(
      40, 8, [](int, int) { return 1.0; }, [](int, int) { return 100; });
  ElasticReplayConfig c = Config(4, 2, 8);
  c.spec.device.capacity_bytes = 200;  // 2 layers per device: 4 stages
  auto r = ReplayElastic(trace, c);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 5u);
  const double base = Mode(*r, ElasticMode::kStatic).total_s;
  // (m + p - 1) * 2 per iteration, m = 4 per replica.
  EXPECT_NEAR(base, 40 * (4 + 3) * 2.0, 1e-6);
  for (const ModeResult& m : *r) {
    EXPECT_NEAR(m.total_s, base, 1e-6) << ElasticModeName(m.mode);
    EXPECT_EQ(m.changes, 0) << ElasticModeName(m.mode);
    EXPECT_NEAR(m.mean_gpus, 8, 1e-9);
  }
}

TEST(ReplayElastic, ReBalancingFollowsAShrinkingBackHalfAndTheOracleBoundsIt) {
  // From iteration 10 the last four layers cost a quarter: on 2 stages the
  // uniform split is 4 : 1 and the best 3 : 2.
  const Trace trace = MakeTrace(
      60, 8, [](int k, int l) { return k >= 10 && l >= 4 ? 0.25 : 1.0; },
      [](int, int) { return 100; });
  auto r = ReplayElastic(trace, Config(2, 1, 4));
  ASSERT_TRUE(r.ok()) << r.status();
  const double fixed = Mode(*r, ElasticMode::kStatic).total_s;
  const ModeResult& moving = Mode(*r, ElasticMode::kRepartition);
  const ModeResult& oracle = Mode(*r, ElasticMode::kOracle);
  EXPECT_GE(moving.changes, 1);
  EXPECT_LT(moving.total_s, fixed * 0.9);
  EXPECT_LE(oracle.total_s, moving.total_s + 1e-9);
  EXPECT_EQ(moving.final_grid.boundaries, (Boundaries{0, 3, 8}));
}

TEST(ReplayElastic, ReleaseHandsBackStagesAtTheSameBottleneck) {
  // Layers 4..7 become free: stages 2 and 3 have nothing to do. The static
  // layout's bottleneck is 2 (two unit layers), which 2 stages also reach,
  // so at tolerance 1% two stages (of 2 replicas each) are released.
  const Trace trace = MakeTrace(
      40, 8, [](int k, int l) { return k >= 5 && l >= 4 ? 0.0 : 1.0; },
      [](int, int) { return 100; });
  ElasticReplayConfig c = Config(4, 2, 8);
  c.repack_tolerance = 0.01;
  auto r = ReplayElastic(trace, c);
  ASSERT_TRUE(r.ok()) << r.status();
  const ModeResult& release = Mode(*r, ElasticMode::kRelease);
  EXPECT_EQ(release.final_grid.pp, 2);
  EXPECT_EQ(release.final_grid.dp, 2);
  EXPECT_LT(release.mean_gpus, 8);
  ASSERT_FALSE(release.events.empty());
  EXPECT_NE(release.events.front().what.find("release"), std::string::npos);
}

TEST(ReplayElastic, ReshapeRunsMoreReplicasOnceTheModelFitsFewerStages) {
  // 8 layers of 100 bytes on devices of 200: 4 stages are needed. From
  // iteration 10 every layer shrinks to 50 bytes (pruned into CSR) and
  // becomes cheaper in its back half, so 2 x 4 fits and pays.
  const Trace trace = MakeTrace(
      60, 8, [](int k, int l) { return k >= 10 && l >= 4 ? 0.2 : 1.0; },
      [](int k, int) { return k >= 10 ? 50 : 100; });
  ElasticReplayConfig c = Config(4, 2, 16);
  c.spec.device.capacity_bytes = 200;
  auto r = ReplayElastic(trace, c);
  ASSERT_TRUE(r.ok()) << r.status();
  const ModeResult& reshape = Mode(*r, ElasticMode::kReshape);
  const ModeResult& moving = Mode(*r, ElasticMode::kRepartition);
  EXPECT_EQ(reshape.final_grid.pp * reshape.final_grid.dp, 8);
  EXPECT_LT(reshape.final_grid.pp, 4);
  ASSERT_FALSE(reshape.events.empty());
  EXPECT_EQ(reshape.events.front().iter, 14);  // the first decision after k = 10
  EXPECT_GT(reshape.final_tokens_per_s, moving.final_tokens_per_s);
  EXPECT_NEAR(reshape.mean_gpus, 8, 1e-9);
}

TEST(ReplayElastic, AReshapeMustRepayItsCopy) {
  const Trace trace = MakeTrace(
      60, 8, [](int k, int l) { return k >= 10 && l >= 4 ? 0.2 : 1.0; },
      [](int k, int) { return k >= 10 ? 50 : 100; });
  ElasticReplayConfig c = Config(4, 2, 16);
  c.spec.device.capacity_bytes = 200;
  c.spec.data_parallel.copy_bandwidth_bytes_per_s = 1e-6;  // copies take ages
  auto r = ReplayElastic(trace, c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Mode(*r, ElasticMode::kReshape).final_grid.pp, 4);
}

TEST(MeanCosts, AveragesLayerByLayer) {
  std::vector<LayerCost> a(2), b(2);
  a[0].fwd_s = 1;
  b[0].fwd_s = 3;
  a[1].resident_bytes = 10;
  b[1].resident_bytes = 20;
  const std::vector<LayerCost> m = MeanCosts({a, b});
  EXPECT_EQ(m[0].fwd_s, 2);
  EXPECT_EQ(m[1].resident_bytes, 15);
  EXPECT_EQ(m[1].id, 1);
}

TEST(ReplayElastic, DecisionsUseTheSmoothedWindowNotOneRecord) {
  // Layer 7 alternates between 1 and 3 every record: one record says "move
  // everything off it" and the next the opposite. The 4-record mean is
  // steady, so the plan is decided once and never flaps.
  const Trace trace = MakeTrace(
      80, 8, [](int k, int l) { return l == 7 ? (k % 2 ? 3.0 : 1.0) : 1.0; },
      [](int, int) { return 100; });
  ElasticReplayConfig c = Config(4, 1, 8);
  c.trigger.every = 4;
  auto smoothed = ReplayElastic(trace, c);
  ASSERT_TRUE(smoothed.ok()) << smoothed.status();
  EXPECT_LE(Mode(*smoothed, ElasticMode::kRepartition).changes, 1);
  c.smoothing_window = 1;
  c.trigger.every = 3;  // alternate records decide
  auto single = ReplayElastic(trace, c);
  ASSERT_TRUE(single.ok());
  EXPECT_GT(Mode(*single, ElasticMode::kRepartition).changes,
            Mode(*smoothed, ElasticMode::kRepartition).changes);
}

TEST(ReplayElastic, BadConfigIsRefused) {
  const Trace trace = MakeTrace(
      4, 4, [](int, int) { return 1.0; }, [](int, int) { return 1; });
  ElasticReplayConfig c = Config(4, 1, 4);
  c.smoothing_window = -1;
  EXPECT_FALSE(ReplayElastic(trace, c).ok());
  c = Config(5, 1, 4);
  EXPECT_FALSE(ReplayElastic(trace, c).ok());
  c = Config(4, 1, 4);
  c.trigger.kind = RebalanceTrigger::Kind::kManual;
  EXPECT_FALSE(ReplayElastic(trace, c).ok());
  c = Config(2, 2, 3);  // 3 micro-batches over 2 replicas
  EXPECT_FALSE(ReplayElastic(trace, c).ok());
  EXPECT_FALSE(ReplayElastic(Trace{}, Config(1, 1, 1)).ok());
}

}  // namespace
}  // namespace dynmo::core

namespace dynmo::core {
namespace {

TEST(SmoothedCosts, AveragesJitterButStopsAtAStep) {
  auto record = [](double t) {
    std::vector<LayerCost> r(2);
    r[0].fwd_s = t;
    r[1].fwd_s = 1;
    return r;
  };
  // 1.0, then a step to 2.0 with +-1% jitter: only the records after the
  // step are averaged.
  std::deque<std::vector<LayerCost>> recent = {record(1.0), record(1.0), record(2.02),
                                               record(1.98), record(2.0)};
  const std::vector<LayerCost> s = SmoothedCosts(recent, 0.05);
  EXPECT_NEAR(s[0].fwd_s, 2.0, 1e-12);
  // With no threshold at all every record is its own step.
  EXPECT_NEAR(SmoothedCosts(recent, 0)[0].fwd_s, 2.0, 1e-12);
  EXPECT_NEAR(SmoothedCosts({record(1.0), record(3.0)}, 10)[0].fwd_s, 2.0, 1e-12);
}

}  // namespace
}  // namespace dynmo::core
