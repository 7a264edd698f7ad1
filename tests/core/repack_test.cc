// Re-packing: the fewest stages at (nearly) the same bottleneck, contiguous
// survivors, a consistent communicator split, and the paper's first-fit.
#include "core/repack.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "core/measures.h"
#include "core/partition.h"

namespace dynmo::core {
namespace {

PipelineModel Model(const std::vector<double>& times, int stages,
                    int64_t bytes_per_layer = 100) {
  PipelineModel m;
  for (size_t i = 0; i < times.size(); ++i) {
    LayerCost l;
    l.id = static_cast<int>(i);
    l.fwd_s = times[i];
    l.resident_bytes = bytes_per_layer;
    m.layers.push_back(l);
  }
  m.stages.assign(stages, StageSpec{});
  return m;
}

// 6 equal layers on 4 stages, stage 2 at half speed, placed 0,2,4,5,6.
PipelineModel SlowMiddleStage() {
  PipelineModel m = Model(std::vector<double>(6, 1.0), 4);
  m.stages[2].speed = 0.5;
  return m;
}
Boundaries SlowMiddleLayout() { return Boundaries{0, 2, 4, 5, 6}; }

TEST(RepackOptimal, TheSlowestRankIsReleasedFirstEvenInTheMiddle) {
  // 6 equal layers on 4 stages, stage 2 at half speed. On all 4 the best
  // bottleneck is 2 (stage 2 holds one layer: 1 / 0.5). The three fast
  // stages reach it too (2, 2, 2), but no window of three does (each holds
  // the slow stage: best 3), so at tolerance 0 the slow middle stage is the
  // one released and stages 1 and 3 become neighbours.
  PipelineModel m = SlowMiddleStage();
  RepackOptions o;
  o.current = SlowMiddleLayout();
  auto r = RepackOptimal(m, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->active_stages, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(r->released_stages, (std::vector<int>{2}));
  EXPECT_EQ(r->boundaries, (Boundaries{0, 2, 4, 6}));
  EXPECT_DOUBLE_EQ(r->bottleneck, 2.0);
  ASSERT_EQ(r->split.size(), 4u);
  EXPECT_EQ(r->split[0].key, 0);
  EXPECT_EQ(r->split[1].key, 1);
  EXPECT_EQ(r->split[2].color, kReleasedColor);
  EXPECT_EQ(r->split[2].key, -1);
  EXPECT_EQ(r->split[3].color, 0);
  EXPECT_EQ(r->split[3].key, 2);
  // Layer 4 leaves the released stage for stage 3; nothing else moves.
  ASSERT_EQ(r->migration.migrations.size(), 1u);
  EXPECT_EQ(r->migration.migrations[0].layer, 4);
  EXPECT_EQ(r->migration.migrations[0].from_stage, 2);
  EXPECT_EQ(r->migration.migrations[0].to_stage, 3);
  // At equal speeds the same job trims an end, as before.
  m.stages[2].speed = 1.0;
  auto even = RepackOptimal(m, o);
  ASSERT_TRUE(even.ok()) << even.status();
  EXPECT_EQ(even->active_stages.size(), 3u);
  EXPECT_TRUE(even->active_stages == (std::vector<int>{0, 1, 2}) ||
              even->active_stages == (std::vector<int>{1, 2, 3}));
}

TEST(RepackOptimal, StageIdsNameTheResultAsTheJobDoes) {
  // The job above once re-packed already: its four stages are the job's
  // stages 3, 5, 7 and 9. The same choice comes back in those names.
  const PipelineModel m = SlowMiddleStage();
  RepackOptions o;
  o.current = SlowMiddleLayout();
  auto plain = RepackOptimal(m, o);
  o.stage_ids = {3, 5, 7, 9};
  auto r = RepackOptimal(m, o);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->active_stages, (std::vector<int>{3, 5, 9}));
  EXPECT_EQ(r->released_stages, (std::vector<int>{7}));
  EXPECT_EQ(r->boundaries, plain->boundaries);
  EXPECT_DOUBLE_EQ(r->bottleneck, plain->bottleneck);
  ASSERT_EQ(r->split.size(), plain->split.size());
  for (size_t i = 0; i < r->split.size(); ++i) {
    EXPECT_EQ(r->split[i].stage, o.stage_ids[i]);
    EXPECT_EQ(r->split[i].color, plain->split[i].color);
    EXPECT_EQ(r->split[i].key, plain->split[i].key);
  }
  ASSERT_EQ(r->migration.migrations.size(), plain->migration.migrations.size());
  for (size_t i = 0; i < r->migration.migrations.size(); ++i) {
    const LayerMigration& a = plain->migration.migrations[i];
    const LayerMigration& b = r->migration.migrations[i];
    EXPECT_EQ(b.layer, a.layer);
    EXPECT_EQ(b.round, a.round);
    EXPECT_EQ(b.from_stage, o.stage_ids[static_cast<size_t>(a.from_stage)]);
    EXPECT_EQ(b.to_stage, o.stage_ids[static_cast<size_t>(a.to_stage)]);
  }
  EXPECT_EQ(r->migration.total_bytes, plain->migration.total_bytes);
}

TEST(RepackOptimal, BadStageIdsAreRefused) {
  PipelineModel m = Model(std::vector<double>(6, 1.0), 4);
  RepackOptions o;
  for (const std::vector<int>& ids :
       {std::vector<int>{0, 1, 2}, std::vector<int>{0, 1, 1, 2}, std::vector<int>{-1, 1, 2, 3}}) {
    o.stage_ids = ids;
    auto r = RepackOptimal(m, o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("stage ids"), std::string::npos) << r.status();
  }
}

TEST(RepackOptimal, TheSurvivorsMatchABruteForceOverEverySubsetWithSpeeds) {
  // Small random jobs with one or two slow ranks: the bottleneck re-packing
  // reaches with the fewest stages is never worse than the best window of
  // that count, and never better than the best subset of that count.
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> t(0.5, 2.0);
  for (int trial = 0; trial < 40; ++trial) {
    const int k = 3 + trial % 3;
    std::vector<double> times(8);
    for (double& x : times) x = t(rng);
    PipelineModel m = Model(times, k);
    m.stages[static_cast<size_t>(trial % k)].speed = 0.5;
    if (trial % 2 == 0) m.stages[static_cast<size_t>((trial + 1) % k)].speed = 0.7;
    RepackOptions o;
    o.tolerance = 0.2;
    auto r = RepackOptimal(m, o);
    ASSERT_TRUE(r.ok()) << r.status();
    const int count = static_cast<int>(r->active_stages.size());
    double best_subset = 1e300, best_window = 1e300;
    for (int mask = 1; mask < (1 << k); ++mask) {
      if (__builtin_popcount(static_cast<unsigned>(mask)) != count) continue;
      PipelineModel sub = m;
      sub.stages.clear();
      int first = -1, last = -1;
      for (int s = 0; s < k; ++s) {
        if (mask & (1 << s)) {
          sub.stages.push_back(m.stages[static_cast<size_t>(s)]);
          if (first < 0) first = s;
          last = s;
        }
      }
      auto b = OptimalBottleneck(sub);
      ASSERT_TRUE(b.ok());
      best_subset = std::min(best_subset, *b);
      if (last - first + 1 == count) best_window = std::min(best_window, *b);
    }
    EXPECT_LE(r->bottleneck, best_window + 1e-12) << "trial " << trial;
    EXPECT_GE(r->bottleneck, best_subset - 1e-12) << "trial " << trial;
  }
}

TEST(RepackOptimal, AReferenceFromTheFullJobKeepsTolerancesFromCompounding) {
  // 8 equal layers on 8 stages, tolerance 1 (a 2x slower bottleneck allowed):
  // the first re-pack goes to 4 stages (bottleneck 2 = 2 x 1).
  PipelineModel m = Model(std::vector<double>(8, 1.0), 8);
  RepackOptions o;
  o.tolerance = 1.0;
  auto first = RepackOptimal(m, o);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->active_stages.size(), 4u);
  // Asked again on the 4 survivors, relative to their own optimum (2) it
  // would halve again to 2 stages (bottleneck 4 = 4x the job's best) ...
  PipelineModel survivors = Model(std::vector<double>(8, 1.0), 4);
  RepackOptions again;
  again.tolerance = 1.0;
  again.current = first->boundaries;
  auto compounding = RepackOptimal(survivors, again);
  ASSERT_TRUE(compounding.ok());
  EXPECT_EQ(compounding->active_stages.size(), 2u);
  // ... relative to the full job's optimum (1) it stays where it is.
  again.reference_bottleneck = 1.0;
  auto fixed = RepackOptimal(survivors, again);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ(fixed->active_stages.size(), 4u);
  EXPECT_TRUE(fixed->released_stages.empty());
  EXPECT_EQ(fixed->bottleneck, 2.0);
  // A reference no layout can reach releases nothing and is no error.
  again.reference_bottleneck = 0.01;
  auto tight = RepackOptimal(survivors, again);
  ASSERT_TRUE(tight.ok()) << tight.status();
  EXPECT_EQ(tight->active_stages.size(), 4u);
  again.reference_bottleneck = 0.0;
  EXPECT_FALSE(RepackOptimal(survivors, again).ok());
}

TEST(RepackOptimal, OneHeavyLayerLetsTheOthersShareAStage) {
  // The heavy layer bounds the bottleneck at 10 whatever we do; the light
  // layers on either side of it (3 each) need a stage each, not two.
  PipelineModel m = Model({1, 1, 1, 10, 1, 1, 1}, 4);
  auto r = RepackOptimal(m, RepackOptions{});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->reference_bottleneck, 10.0);
  EXPECT_EQ(r->bottleneck, 10.0);
  EXPECT_EQ(r->active_stages.size(), 3u);
  EXPECT_EQ(r->released_stages.size(), 1u);
  EXPECT_EQ(r->boundaries, (Boundaries{0, 3, 4, 7}));
}

TEST(RepackOptimal, ZeroToleranceNeverLosesThroughput) {
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int> t(0, 12);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<double> times(2 + trial % 10);
    for (double& x : times) x = t(rng);
    const int k = 1 + trial % static_cast<int>(times.size());
    PipelineModel m = Model(times, k);
    auto r = RepackOptimal(m, RepackOptions{});
    ASSERT_TRUE(r.ok()) << r.status();
    auto full = OptimalBottleneck(m);
    ASSERT_TRUE(full.ok());
    EXPECT_LE(r->bottleneck, *full);
    // Minimality: one stage fewer must lose throughput.
    const int active = static_cast<int>(r->active_stages.size());
    if (active > 1) {
      PipelineModel fewer = m;
      fewer.stages.resize(active - 1);
      auto b = OptimalBottleneck(fewer);
      ASSERT_TRUE(b.ok());
      EXPECT_GT(*b, *full) << "trial " << trial;
    }
  }
}

TEST(RepackOptimal, ToleranceTradesThroughputForGpus) {
  PipelineModel m = Model(std::vector<double>(8, 1.0), 4);
  auto strict = RepackOptimal(m, RepackOptions{});
  ASSERT_TRUE(strict.ok());
  EXPECT_EQ(strict->active_stages.size(), 4u);
  RepackOptions loose;
  loose.tolerance = 1.0;  // bottleneck may double
  auto r = RepackOptimal(m, loose);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->active_stages.size(), 2u);
  EXPECT_EQ(r->bottleneck, 4.0);
}

TEST(RepackOptimal, SurvivorsAreContiguousAndSplitIsConsistent) {
  PipelineModel m = Model({1, 1, 1, 10, 1, 1, 1}, 4);
  auto r = RepackOptimal(m, RepackOptions{});
  ASSERT_TRUE(r.ok());
  for (size_t i = 1; i < r->active_stages.size(); ++i) {
    EXPECT_EQ(r->active_stages[i], r->active_stages[i - 1] + 1);
  }
  ASSERT_EQ(r->split.size(), 4u);
  int next_key = 0;
  for (const CommSplit& c : r->split) {
    const bool active = std::count(r->active_stages.begin(),
                                   r->active_stages.end(), c.stage) > 0;
    if (active) {
      EXPECT_EQ(c.color, 0);
      EXPECT_EQ(c.key, next_key++);
    } else {
      EXPECT_EQ(c.color, kReleasedColor);
      EXPECT_EQ(c.key, -1);
    }
  }
}

TEST(RepackOptimal, MovesNoLayerOntoAReleasedStage) {
  PipelineModel m = Model({1, 1, 1, 10, 1, 1, 1}, 4);
  RepackOptions o;
  o.current = Boundaries{0, 2, 3, 4, 7};
  auto r = RepackOptimal(m, o);
  ASSERT_TRUE(r.ok());
  for (const LayerMigration& mv : r->migration.migrations) {
    EXPECT_TRUE(std::count(r->active_stages.begin(), r->active_stages.end(),
                           mv.to_stage))
        << "layer " << mv.layer << " sent to released stage " << mv.to_stage;
  }
}

TEST(RepackOptimal, MemoryCapsLimitPacking) {
  PipelineModel m = Model(std::vector<double>(8, 0.0), 4);
  for (auto& s : m.stages) s.capacity_bytes = 300;  // three layers a stage
  auto r = RepackOptimal(m, RepackOptions{});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->active_stages.size(), 3u);
  for (int64_t mem : StageMemoryUse(m, r->boundaries)) EXPECT_LE(mem, 300);
}

TEST(RepackOptimal, PacksMoreStagesThanLayers) {
  PipelineModel m = Model({2, 2}, 5);
  auto r = RepackOptimal(m, RepackOptions{});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->active_stages.size(), 2u);
  EXPECT_EQ(r->released_stages.size(), 3u);
}

TEST(RepackOptimal, RejectsNegativeTolerance) {
  RepackOptions o;
  o.tolerance = -0.5;
  EXPECT_FALSE(RepackOptimal(Model({1, 1}, 2), o).ok());
}

TEST(RepackFirstFit, MergesPairsThatFitOneGpu) {
  PipelineModel m = Model(std::vector<double>(4, 1.0), 4);
  for (auto& s : m.stages) s.capacity_bytes = 250;  // two layers fit
  auto r = RepackFirstFit(m, {0, 1, 2, 3, 4}, 1);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->active_stages.size(), 2u);
  EXPECT_EQ(r->released_stages.size(), 2u);
  EXPECT_TRUE(r->contiguous);
  EXPECT_EQ(r->migration.total_bytes, 200);
}

TEST(RepackFirstFit, ReportsBrokenLayerOrder) {
  // Stage 0 cannot join stage 1 (too big together) but can join stage 2,
  // which puts layer 0 after layers of stage 1: order broken.
  PipelineModel m = Model(std::vector<double>(3, 1.0), 3);
  m.layers[1].resident_bytes = 900;
  for (auto& s : m.stages) s.capacity_bytes = 1000;
  auto r = RepackFirstFit(m, {0, 1, 2, 3}, 1);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->contiguous);
}

TEST(RepackFirstFit, StopsAtTarget) {
  PipelineModel m = Model(std::vector<double>(4, 1.0), 4);
  auto r = RepackFirstFit(m, {0, 1, 2, 3, 4}, 3);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->active_stages.size(), 3u);
}

}  // namespace
}  // namespace dynmo::core
