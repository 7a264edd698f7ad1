#include "core/rank_speed.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>
#include <cstdint>
#include <limits>

#include "core/cost_model.h"
#include "core/measures.h"
#include "core/partition.h"
#include "gtest/gtest.h"
#include "tests/core/seeded_noise.h"

namespace dynmo::core {
namespace {

TEST(RankSpeedTest, UnprobedRanksRunAtOne) {
  RankSpeeds s(4, RankSpeedOptions{});
  for (int r = 0; r < 4; ++r) EXPECT_EQ(s.speed(r), 1.0);
  EXPECT_EQ(s.speed(7), 1.0);
  EXPECT_FALSE(s.AddProbe(9, 1.0));
  EXPECT_FALSE(s.AddProbe(0, std::numeric_limits<double>::quiet_NaN()));
  EXPECT_FALSE(s.AddProbe(0, -1));
}

TEST(RankSpeedTest, StationaryNoiseOnEqualRanksNeverMovesASpeed) {
  // 8 equal ranks, probes with +-5% uniform jitter, 5,000 rounds.
  RankSpeeds s(8, RankSpeedOptions{});
  Lcg rng(42);
  for (int round = 0; round < 5000; ++round) {
    for (int r = 0; r < 8; ++r) {
      EXPECT_FALSE(s.AddProbe(r, 0.010 * (1 + 0.05 * rng.Next())))
          << "round " << round << " rank " << r;
    }
  }
  for (int r = 0; r < 8; ++r) EXPECT_EQ(s.speed(r), 1.0);
}

TEST(RankSpeedTest, AThrottleIsFollowedWithinBoundedProbesAndRecoveryToo) {
  RankSpeedOptions o;
  RankSpeeds s(2, o);
  Lcg rng(7);
  auto round = [&](double slow) {
    bool changed = s.AddProbe(0, 0.010 * (1 + 0.02 * rng.Next()));
    changed = s.AddProbe(1, 0.010 * slow * (1 + 0.02 * rng.Next())) || changed;
    return changed;
  };
  for (int i = 0; i < 50; ++i) EXPECT_FALSE(round(1.0));
  // Rank 1 halves its speed: published within a bounded number of probes.
  int after = -1;
  for (int i = 0; i < 30 && after < 0; ++i) {
    if (round(2.0)) after = i;
  }
  ASSERT_GE(after, 0) << "the throttle was never noticed";
  EXPECT_LE(after, 10);
  // The EWMA may publish a first step before it settles; it reaches 0.5.
  for (int i = 0; i < 40; ++i) round(2.0);
  EXPECT_NEAR(s.speed(1), 0.5, 0.05);
  EXPECT_EQ(s.speed(0), 1.0);
  // It recovers and gets its speed back.
  for (int i = 0; i < 60; ++i) round(1.0);
  EXPECT_NEAR(s.speed(1), 1.0, 0.05);
}

// Probes on a shared core scatter some 15% (measured on the 2-core VM, see
// docs/benchmarks.md). Equal ranks then publish nothing, over seeds ...
TEST(RankSpeedTest, ProbesScattering15PercentOnEqualRanksPublishNothing) {
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    RankSpeeds s(2, RankSpeedOptions{});
    Lcg rng(seed);
    for (int round = 0; round < 5000; ++round) {
      for (int r = 0; r < 2; ++r) {
        // Uniform +-26%: a standard deviation of 15%.
        EXPECT_FALSE(s.AddProbe(r, 0.010 * (1 + 0.26 * rng.Next())))
            << "seed " << seed << " round " << round << " rank " << r;
      }
    }
  }
}

// ... while a rank slowed to 0.7 from the start, less than the spread of
// one probe, is published once the mean of its probes says so.
TEST(RankSpeedTest, ARankSlowerByLessThanAProbesSpreadIsPublished) {
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    RankSpeeds s(2, RankSpeedOptions{});
    Lcg rng(seed);
    int published = -1;
    for (int round = 0; round < 60; ++round) {
      s.AddProbe(0, 0.010 * (1 + 0.26 * rng.Next()));
      s.AddProbe(1, 0.010 / 0.7 * (1 + 0.26 * rng.Next()));
      if (published < 0 && s.speed(1) < 1) published = round;
    }
    ASSERT_GE(published, 0) << "seed " << seed << ": rank 1 was never published";
    EXPECT_LE(published, 20) << "seed " << seed;
    EXPECT_NEAR(s.speed(1), 0.7, 0.1) << "seed " << seed;
    EXPECT_EQ(s.speed(0), 1.0) << "seed " << seed;
  }
}

// A rank whose probes come in faster than its level "may be faster" until
// they confirm a step (then its speed is published) or one comes back; a
// rank whose probes come in slower never is.
TEST(RankSpeedTest, AFasterProbeIsInDoubtUntilConfirmedOrBack) {
  RankSpeedOptions o;
  RankSpeeds s(2, o);
  for (int i = 0; i < o.warmup; ++i) {
    s.AddProbe(0, 0.010);
    s.AddProbe(1, 0.020);
  }
  ASSERT_NEAR(s.speed(1), 0.5, 1e-9);
  EXPECT_FALSE(s.may_be_faster(1));
  EXPECT_FALSE(s.may_be_faster(-1));
  EXPECT_FALSE(s.may_be_faster(2));
  // A lone fast probe, then one at the level: in doubt, then not.
  EXPECT_FALSE(s.AddProbe(1, 0.010));
  EXPECT_TRUE(s.may_be_faster(1));
  s.AddProbe(1, 0.020);
  EXPECT_FALSE(s.may_be_faster(1));
  // Slower probes are not in doubt.
  s.AddProbe(1, 0.040);
  EXPECT_FALSE(s.may_be_faster(1));
  s.AddProbe(1, 0.020);
  // The throttle ends: in doubt until the confirmations publish it.
  for (int i = 1; i < o.confirmations; ++i) {
    EXPECT_FALSE(s.AddProbe(1, 0.010));
    EXPECT_TRUE(s.may_be_faster(1)) << "probe " << i;
  }
  EXPECT_TRUE(s.AddProbe(1, 0.010));
  EXPECT_FALSE(s.may_be_faster(1));
  EXPECT_NEAR(s.speed(1), 1.0, 1e-9);
}

// Brute force: every contiguous split of `costs` over stages of `speeds`.
double BestBottleneck(const std::vector<double>& costs, const std::vector<double>& speeds) {
  const int n = static_cast<int>(costs.size());
  const int k = static_cast<int>(speeds.size());
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> b(k + 1, 0);
  b[k] = n;
  // Enumerate cut positions 1 <= c1 < c2 < ... < c_{k-1} <= n-1.
  std::function<void(int, int)> rec = [&](int stage, int from) {
    if (stage == k - 1) {
      double worst = 0;
      for (int s = 0; s < k; ++s) {
        double load = 0;
        for (int l = b[s]; l < b[s + 1]; ++l) load += costs[static_cast<size_t>(l)];
        worst = std::max(worst, load / speeds[static_cast<size_t>(s)]);
      }
      best = std::min(best, worst);
      return;
    }
    for (int c = from; c <= n - (k - 1 - stage); ++c) {
      b[stage + 1] = c;
      rec(stage + 1, c + 1);
    }
  };
  rec(0, 1);
  return best;
}

TEST(RankSpeedTest, ASlowStageGetsProportionallyFewerLayersExactly) {
  // 12 layers of mixed cost on 3 stages; stage 1 at 0.5, stage 2 at 0.8.
  PipelineModel model;
  const std::vector<double> costs = {1, 2, 1, 3, 1, 1, 2, 2, 1, 1, 3, 1};
  for (size_t i = 0; i < costs.size(); ++i) {
    LayerCost l;
    l.id = static_cast<int>(i);
    l.fwd_s = costs[i] / 3;
    l.bwd_s = 2 * costs[i] / 3;
    model.layers.push_back(l);
  }
  const std::vector<double> speeds = {1.0, 0.5, 0.8};
  for (double v : speeds) {
    StageSpec st;
    st.speed = v;
    model.stages.push_back(st);
  }
  PartitionOptions po;
  po.method = PartitionMethod::kOptimal;
  absl::StatusOr<PartitionResult> p = Partition(model, po);
  ASSERT_TRUE(p.ok()) << p.status();
  const double got = Bottleneck(StageLoads(model, p->boundaries));
  EXPECT_NEAR(got, BestBottleneck(costs, speeds), 1e-9);
  // The slow stage holds fewer layers' worth of cost than the fast one.
  double slow = 0, fast = 0;
  for (int l = p->boundaries[1]; l < p->boundaries[2]; ++l) slow += costs[l];
  for (int l = p->boundaries[0]; l < p->boundaries[1]; ++l) fast += costs[l];
  EXPECT_LT(slow, fast);
}

// A straggler at about 0.6 whose five warm-up probes scatter 40%: too
// few to publish its speed, enough to doubt speed 1. It is in doubt from
// its warm-up on, until its speed is published or doubt_probes probes
// have passed; the steady rank never is.
TEST(RankSpeedTest, AWarmRankWhoseProbesScatteredIsInDoubtForAFewProbes) {
  RankSpeedOptions o;
  RankSpeeds s(2, o);
  const double scattered[] = {0.010, 0.024, 0.012, 0.022, 0.012};  // mean 0.016
  for (double p : scattered) {
    s.AddProbe(0, 0.010);
    EXPECT_FALSE(s.in_doubt(1)) << "not warm yet";
    s.AddProbe(1, p);
  }
  EXPECT_EQ(s.speed(1), 1.0) << "the scatter keeps the publish gate shut";
  EXPECT_TRUE(s.in_doubt(1));
  EXPECT_FALSE(s.in_doubt(0));
  int cleared = -1;
  for (int i = 0; i < o.doubt_probes + 3; ++i) {
    s.AddProbe(0, 0.010);
    s.AddProbe(1, 0.016);
    if (!s.in_doubt(1) && cleared < 0) cleared = i + 1;
    EXPECT_FALSE(s.in_doubt(0));
  }
  ASSERT_GE(cleared, 1);
  EXPECT_LE(cleared, o.doubt_probes) << "the doubt is bounded";
  EXPECT_LT(s.speed(1), 0.8) << "the speed its level calls for was published";

  // With doubt_probes 0 nothing is ever in doubt.
  o.doubt_probes = 0;
  RankSpeeds none(2, o);
  for (double p : scattered) {
    none.AddProbe(0, 0.010);
    none.AddProbe(1, p);
  }
  EXPECT_FALSE(none.in_doubt(1));
}

// Equal ranks whose probes scatter 15%: whatever doubt their warm-up
// leaves ends within doubt_probes probes, and nothing is published.
TEST(RankSpeedTest, EqualRanksDoubtNoLongerThanTheBound) {
  RankSpeedOptions o;
  int doubted = 0;
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    RankSpeeds s(4, o);
    Lcg rng(seed);
    for (int round = 0; round < o.warmup + o.doubt_probes + 20; ++round) {
      for (int r = 0; r < 4; ++r) s.AddProbe(r, 0.010 * (1 + 0.15 * rng.Next()));
      for (int r = 0; r < 4; ++r) {
        if (round == o.warmup - 1 && s.in_doubt(r)) ++doubted;
        if (round >= o.warmup + o.doubt_probes - 1) {
          EXPECT_FALSE(s.in_doubt(r)) << "seed " << seed << " round " << round;
        }
      }
    }
  }
  // Rarely does a warm-up leave equal ranks in doubt (doubt_min_change: 3
  // of these 800 ranks; 62 without it), and never past the bound.
  EXPECT_LE(doubted, 8) << doubted;
}

TEST(RankSpeedTest, OptionsAreValidated) {
  EXPECT_TRUE(ValidateRankSpeedOptions(RankSpeedOptions{}).ok());
  RankSpeedOptions o;
  o.smoothing = 0;
  EXPECT_FALSE(ValidateRankSpeedOptions(o).ok());
  o = RankSpeedOptions{};
  o.confirmations = 0;
  EXPECT_FALSE(ValidateRankSpeedOptions(o).ok());
  o = RankSpeedOptions{};
  o.sigmas = std::nan("");
  EXPECT_FALSE(ValidateRankSpeedOptions(o).ok());
  o = RankSpeedOptions{};
  o.doubt_sigmas = std::nan("");
  EXPECT_FALSE(ValidateRankSpeedOptions(o).ok());
  o = RankSpeedOptions{};
  o.doubt_probes = -1;
  EXPECT_FALSE(ValidateRankSpeedOptions(o).ok());
  o = RankSpeedOptions{};
  o.doubt_min_change = -0.1;
  EXPECT_FALSE(ValidateRankSpeedOptions(o).ok());
  for (const double bound : {0.9, std::nan(""), std::numeric_limits<double>::infinity()}) {
    o = RankSpeedOptions{};
    o.max_layer_correction = bound;
    EXPECT_FALSE(ValidateRankSpeedOptions(o).ok()) << bound;
  }
}

}  // namespace
}  // namespace dynmo::core
