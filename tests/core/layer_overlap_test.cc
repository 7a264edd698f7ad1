#include "core/layer_overlap.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/rank_speed.h"
#include "gtest/gtest.h"
#include "tests/core/seeded_noise.h"

namespace dynmo::core {
namespace {

LayerOverlapOptions Quick() {
  LayerOverlapOptions o;
  o.settle = 1;
  o.min_samples = 2;
  return o;
}

TEST(LayerOverlapTest, ReplicasGiveTheLayersRatioBeyondTheProbes) {
  // Rank 1's probe runs 2x slower than rank 0's, its layers 1/0.6 slower:
  // relative to what the probes predict, rank 1 runs layers 0.6 * 2 = 1.2x
  // faster, a log ratio of log(1 / 1.2).
  LayerOverlaps o(2, 3, Quick());
  for (int64_t it = 0; it < 10; ++it) {
    for (int l = 0; l < 3; ++l) {
      o.Add(0, l, it, 0.01 * (l + 1), 1e-3);
      o.Add(1, l, it, 0.01 * (l + 1) / 0.6, 2e-3);
    }
  }
  const std::vector<RankOverlap> pairs = o.Pairs();
  ASSERT_EQ(pairs.size(), 1u);
  EXPECT_EQ(pairs[0].a, 0);
  EXPECT_EQ(pairs[0].b, 1);
  EXPECT_EQ(pairs[0].layers, 3);
  EXPECT_NEAR(pairs[0].log_ratio, std::log(1 / 1.2), 1e-12);
  EXPECT_NEAR(pairs[0].sd, 0, 1e-12);
  EXPECT_TRUE(pairs[0].concurrent);  // timed side by side
}

TEST(LayerOverlapTest, NothingBeforeEachSideSettledAndHasEnoughTimes) {
  LayerOverlaps o(2, 1, Quick());  // settle 1 + 2 samples each side
  o.Add(0, 0, 0, 1.0, 1.0);
  o.Add(1, 0, 0, 1.0, 1.0);
  o.Add(0, 0, 1, 1.0, 1.0);
  o.Add(1, 0, 1, 1.0, 1.0);
  EXPECT_TRUE(o.Pairs().empty());
  o.Add(0, 0, 2, 1.0, 1.0);
  EXPECT_TRUE(o.Pairs().empty());
  o.Add(1, 0, 2, 1.0, 1.0);
  EXPECT_EQ(o.Pairs().size(), 1u);
}

TEST(LayerOverlapTest, AMigratedLayerComparesItsTimesBeforeAndAfterTheMove) {
  // Layer 0 on rank 1 for 10 iterations, then on rank 0; rank 0's first
  // (settling) time after the move is an outlier that must not count.
  LayerOverlaps o(2, 1, Quick());
  for (int64_t it = 0; it < 10; ++it) o.Add(1, 0, it, 0.030, 1e-3);
  EXPECT_TRUE(o.Pairs().empty());
  o.Add(0, 0, 10, 1.0, 1e-3);  // the first time after the move: skipped
  o.Add(0, 0, 11, 0.015, 1e-3);
  o.Add(0, 0, 12, 0.015, 1e-3);
  const std::vector<RankOverlap> pairs = o.Pairs();
  ASSERT_EQ(pairs.size(), 1u);
  // u_1 - u_0 = log(0.030 / 0.015): rank 1 runs the layer 2x slower.
  EXPECT_NEAR(pairs[0].log_ratio, std::log(2.0), 1e-12);
  EXPECT_FALSE(pairs[0].concurrent);  // before and after a move
  // The old side keeps its word as iterations pass.
  for (int64_t it = 13; it < 200; ++it) o.Add(0, 0, it, 0.015, 1e-3);
  ASSERT_EQ(o.Pairs().size(), 1u);
  EXPECT_NEAR(o.Pairs()[0].log_ratio, std::log(2.0), 1e-12);
}

TEST(LayerOverlapTest, ALayerTakenUpAgainAfterTheGapStartsAfresh) {
  LayerOverlapOptions opt = Quick();
  opt.gap = 5;
  LayerOverlaps o(2, 1, opt);
  for (int64_t it = 0; it < 4; ++it) {
    o.Add(0, 0, it, 1.0, 1.0);
    o.Add(1, 0, it, 1.0, 1.0);
  }
  ASSERT_EQ(o.Pairs().size(), 1u);
  // Rank 1 takes it up again 20 iterations later, now 3x slower: its old
  // times are gone, and the new ones need their own settling and samples.
  o.Add(1, 0, 24, 3.0, 1.0);
  EXPECT_TRUE(o.Pairs().empty());
  o.Add(1, 0, 25, 3.0, 1.0);
  o.Add(1, 0, 26, 3.0, 1.0);
  ASSERT_EQ(o.Pairs().size(), 1u);
  EXPECT_NEAR(o.Pairs()[0].log_ratio, std::log(3.0), 1e-12);
}

TEST(LayerOverlapTest, OutliersAreLeftOutAndARunOfThemStartsAfresh) {
  LayerOverlapOptions opt = Quick();
  opt.min_samples = 3;
  opt.restart_after = 3;
  LayerOverlaps o(2, 1, opt);
  for (int64_t it = 0; it < 10; ++it) {
    o.Add(0, 0, it, 1.0, 1.0);
    o.Add(1, 0, it, 1.0, 1.0);
  }
  ASSERT_EQ(o.Pairs().size(), 1u);
  // One outlier: left out, the pair in doubt until rank 1 agrees again.
  o.Add(1, 0, 10, 5.0, 1.0);
  EXPECT_TRUE(o.Pairs().empty());
  o.Add(1, 0, 11, 1.0, 1.0);
  ASSERT_EQ(o.Pairs().size(), 1u);
  EXPECT_NEAR(o.Pairs()[0].log_ratio, 0.0, 1e-12);
  // Three in a row: a new regime, learnt afresh (settle 1, 3 samples).
  for (int64_t it = 12; it < 15; ++it) o.Add(1, 0, it, 2.0, 1.0);
  EXPECT_TRUE(o.Pairs().empty());
  for (int64_t it = 15; it < 19; ++it) o.Add(1, 0, it, 2.0, 1.0);
  ASSERT_EQ(o.Pairs().size(), 1u);
  EXPECT_NEAR(o.Pairs()[0].log_ratio, std::log(2.0), 1e-12);
}

TEST(LayerOverlapTest, AModelChangeVoidsEveryEarlierTime) {
  LayerOverlaps o(2, 1, Quick());
  for (int64_t it = 0; it < 4; ++it) {
    o.Add(0, 0, it, 1.0, 1.0);
    o.Add(1, 0, it, 1.0, 1.0);
  }
  ASSERT_EQ(o.Pairs().size(), 1u);
  o.Forget();
  EXPECT_TRUE(o.Pairs().empty());
}

TEST(LayerOverlapTest, BadTimesRanksAndLayersAreIgnored) {
  LayerOverlaps o(2, 1, Quick());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (int64_t it = 0; it < 4; ++it) {
    o.Add(0, 0, it, 1.0, 1.0);
    o.Add(1, 0, it, nan, 1.0);
    o.Add(1, 0, it, 1.0, inf);
    o.Add(1, 0, it, -1.0, 1.0);
    o.Add(1, 0, it, 1.0, 0.0);
    o.Add(2, 0, it, 1.0, 1.0);
    o.Add(-1, 0, it, 1.0, 1.0);
    o.Add(1, 1, it, 1.0, 1.0);
    o.Add(1, -1, it, 1.0, 1.0);
  }
  EXPECT_TRUE(o.Pairs().empty());
  LayerOverlapOptions off = Quick();
  off.enabled = false;
  LayerOverlaps none(2, 1, off);
  for (int64_t it = 0; it < 4; ++it) {
    none.Add(0, 0, it, 1.0, 1.0);
    none.Add(1, 0, it, 1.0, 1.0);
  }
  EXPECT_TRUE(none.Pairs().empty());
}

TEST(LayerOverlapTest, OptionsAreValidated) {
  EXPECT_TRUE(ValidateLayerOverlapOptions(LayerOverlapOptions{}).ok());
  LayerOverlapOptions o;
  o.smoothing = 0;
  EXPECT_FALSE(ValidateLayerOverlapOptions(o).ok());
  o = {};
  o.noise_smoothing = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(ValidateLayerOverlapOptions(o).ok());
  o = {};
  o.settle = -1;
  EXPECT_FALSE(ValidateLayerOverlapOptions(o).ok());
  o = {};
  o.min_samples = 0;
  EXPECT_FALSE(ValidateLayerOverlapOptions(o).ok());
  o = {};
  o.gap = 0;
  EXPECT_FALSE(ValidateLayerOverlapOptions(o).ok());
  o = {};
  o.restart_after = 0;
  EXPECT_FALSE(ValidateLayerOverlapOptions(o).ok());
  o = {};
  o.outlier_sigmas = 0;
  EXPECT_FALSE(ValidateLayerOverlapOptions(o).ok());
  RankSpeedOptions s;
  s.overlap.gap = 0;
  EXPECT_FALSE(ValidateRankSpeedOptions(s).ok());
}

// The probes of rank 1 say half speed; its layers, timed beside rank 0's
// on the same layers, say 0.4. The layers win, to within the fit's pull
// towards the probes (1%).
TEST(RankSpeedOverlapTest, TheLayersCorrectTheProbe) {
  RankSpeeds s(2, RankSpeedOptions{});
  for (int i = 0; i < 5; ++i) {
    s.AddProbe(0, 1e-3);
    s.AddProbe(1, 2e-3);
  }
  EXPECT_DOUBLE_EQ(s.speed(1), 0.5);
  // u_1 - u_0 = log((1 / 0.4) / 2) = log(1.25).
  EXPECT_TRUE(s.SetOverlaps({RankOverlap{0, 1, std::log(1.25), 0.0, 4}}));
  EXPECT_NEAR(s.speed(1), 0.4, 0.4 * 0.01);
  EXPECT_EQ(s.speed(0), 1.0);
  EXPECT_NEAR(s.correction(1) / s.correction(0), 1.25, 1.25 * 0.01);
  // No evidence: the fit stays as it was.
  EXPECT_FALSE(s.SetOverlaps({}));
  EXPECT_NEAR(s.speed(1), 0.4, 0.4 * 0.01);
}

TEST(RankSpeedOverlapTest, ARankNoPairLinksKeepsItsProbesWord) {
  // Ranks 0, 1 are replicas of one stage, ranks 2, 3 of another; rank 3's
  // layers run 1.5x slower than its probe says (against rank 2), rank 1 as
  // its probe says. Rank 1 and rank 2 are linked to nothing else. Timed side
  // by side, the replicas' difference stands whatever its size.
  RankSpeeds s(4, RankSpeedOptions{});
  for (int i = 0; i < 5; ++i) {
    s.AddProbe(0, 1e-3);
    s.AddProbe(1, 2e-3);
    s.AddProbe(2, 1e-3);
    s.AddProbe(3, 1e-3);
  }
  s.SetOverlaps({RankOverlap{0, 1, 0.0, 0.0, 2, /*concurrent=*/true},
                 RankOverlap{2, 3, std::log(1.5), 0.0, 2, /*concurrent=*/true}});
  EXPECT_NEAR(s.speed(1), 0.5, 0.5 * 0.01);
  EXPECT_NEAR(s.speed(3), 1 / 1.5, 0.01);
  EXPECT_GT(s.speed(2), 0.99);
  EXPECT_GT(s.speed(0), 0.99);
}

// The layers refine a probe; they do not overrule it. A layer timed on
// rank 0 before a move and on rank 1 after it says 1.9x, where both ranks'
// probes say equal: what the what-if sweep's freezing replay saw when the
// layer's own cost changed at the switch. The correction stops at
// max_layer_correction, both ways (replicas timed side by side keep theirs:
// ARankNoPairLinksKeepsItsProbesWord), and the option can hand speeds back
// to the probes alone.
TEST(RankSpeedOverlapTest, TheLayersMoveAProbesSpeedByAtMostTheBound) {
  for (const double ratio : {1.9, 1 / 1.9}) {
    RankSpeeds s(2, RankSpeedOptions{});
    for (int i = 0; i < 5; ++i) {
      s.AddProbe(0, 1e-3);
      s.AddProbe(1, 1e-3);
    }
    EXPECT_TRUE(s.SetOverlaps({RankOverlap{0, 1, std::log(ratio), 0.0, 1}})) << ratio;
    const double relative = s.correction(1) / s.correction(0);
    EXPECT_NEAR(relative, ratio > 1 ? 1.25 : 1 / 1.25, 1e-9) << ratio;
    // The slower side's speed: 1 / 1.25 against a full-speed partner.
    EXPECT_NEAR(std::min(s.speed(0), s.speed(1)), 0.8, 1e-9) << ratio;
  }
  RankSpeedOptions probes_only;
  probes_only.max_layer_correction = 1;
  RankSpeeds s(2, probes_only);
  for (int i = 0; i < 5; ++i) {
    s.AddProbe(0, 1e-3);
    s.AddProbe(1, 1e-3);
  }
  EXPECT_FALSE(s.SetOverlaps({RankOverlap{0, 1, std::log(1.9), 0.0, 1}}));
  EXPECT_EQ(s.speed(1), 1.0);
  EXPECT_EQ(s.correction(1), 1.0);
}

TEST(RankSpeedOverlapTest, MalformedPairsAreIgnored) {
  RankSpeeds s(2, RankSpeedOptions{});
  for (int i = 0; i < 5; ++i) {
    s.AddProbe(0, 1e-3);
    s.AddProbe(1, 1e-3);
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(s.SetOverlaps({RankOverlap{0, 5, 1.0, 0.0, 1}, RankOverlap{1, 1, 1.0, 0.0, 1},
                              RankOverlap{0, 1, nan, 0.0, 1}, RankOverlap{0, 1, 1.0, nan, 1},
                              RankOverlap{0, 1, 1.0, 0.0, 0}, RankOverlap{-1, 1, 1.0, 0.0, 1}}));
  EXPECT_EQ(s.speed(0), 1.0);
  EXPECT_EQ(s.speed(1), 1.0);
}

// Stationary noise on equal ranks: 4 stages x 2 replicas, probes with +-5%
// and layer times with +-15% uniform jitter (seeded: 10 seeds), layers
// moving between neighbouring stages every 100 iterations; 3,000
// iterations each, the overlaps refitted every iteration. No speed ever
// moves. (At +-30% layer jitter, 1 of 29 seeds saw one false move.)
TEST(RankSpeedOverlapTest, StationaryNoiseOnEqualRanksNeverMovesASpeed) {
  constexpr int kPp = 4, kDp = 2, kLayers = 16;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    RankSpeeds s(kPp * kDp, RankSpeedOptions{});
    LayerOverlaps o(kPp * kDp, kLayers, RankSpeedOptions{}.overlap);
    Lcg rng(seed);
    std::vector<int> bounds = {0, 4, 8, 12, 16};
    for (int64_t it = 0; it < 3000; ++it) {
      if (it > 0 && it % 100 == 0) {
        // Move one boundary by one layer, back and forth.
        const int b = 1 + static_cast<int>((it / 100) % 3);
        bounds[b] += ((it / 300) % 2 == 0) ? 1 : -1;
      }
      for (int st = 0; st < kPp; ++st) {
        for (int d = 0; d < kDp; ++d) {
          const int rank = st * kDp + d;
          if (s.warm(rank)) {
            for (int l = bounds[st]; l < bounds[st + 1]; ++l) {
              o.Add(rank, l, it, 0.01 * (1 + 0.15 * rng.Next()), s.probe_s(rank));
            }
          }
          ASSERT_FALSE(s.AddProbe(rank, 1e-3 * (1 + 0.05 * rng.Next())))
              << "seed " << seed << " iteration " << it << " rank " << rank;
        }
      }
      ASSERT_FALSE(s.SetOverlaps(o.Pairs())) << "seed " << seed << " iteration " << it;
    }
    for (int r = 0; r < kPp * kDp; ++r) EXPECT_EQ(s.speed(r), 1.0);
  }
}

// A throttle that starts mid-run shows in the probes, and the layers'
// correction found before it still applies: two replicas, rank 1's layers
// 1.25x slower than its probe says; at iteration 200 rank 1 slows 2x in
// both. Its speed goes 0.8 -> 0.4 once, and stays there.
TEST(RankSpeedOverlapTest, AThrottleMidRunIsFollowedOnceWithTheLayersCorrection) {
  RankSpeeds s(2, RankSpeedOptions{});
  LayerOverlaps o(2, 4, RankSpeedOptions{}.overlap);
  Lcg rng(11);
  int moves_after = 0;
  for (int64_t it = 0; it < 400; ++it) {
    const double slow = it < 200 ? 1.0 : 2.0;
    for (int rank = 0; rank < 2; ++rank) {
      const double probe = rank == 1 ? slow : 1.0;
      const double layers = rank == 1 ? slow * 1.25 : 1.0;
      if (s.warm(rank)) {
        for (int l = 0; l < 4; ++l) {
          o.Add(rank, l, it, 0.01 * layers * (1 + 0.05 * rng.Next()), s.probe_s(rank));
        }
      }
      if (s.AddProbe(rank, 1e-3 * probe * (1 + 0.02 * rng.Next())) && it >= 200) ++moves_after;
    }
    if (s.SetOverlaps(o.Pairs()) && it >= 200) ++moves_after;
    if (it == 199) EXPECT_NEAR(s.speed(1), 0.8, 0.8 * 0.03);
  }
  EXPECT_EQ(moves_after, 1);
  EXPECT_NEAR(s.speed(1), 0.4, 0.4 * 0.03);
}

}  // namespace
}  // namespace dynmo::core
