// ProbeCadence (core/probe_cadence.h): when a rank runs the speed probe.
// Deterministic: the layer times are seeded.
#include "core/probe_cadence.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dynmo::core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The iterations in [first, last) that probe, with layer seconds from `at`.
template <typename F>
std::vector<int64_t> Probes(ProbeCadence& c, int64_t first, int64_t last, F at,
                            int64_t changed_at = -1) {
  std::vector<int64_t> out;
  for (int64_t i = first; i < last; ++i) {
    if (c.ShouldProbe(i, at(i), i == changed_at)) out.push_back(i);
  }
  return out;
}

// Layer seconds scattering `noise` (relative, normal) around `level(i)`.
template <typename L>
auto Noisy(L level, double noise, unsigned seed) {
  auto gen = std::make_shared<std::mt19937>(seed);
  return [=](int64_t i) {
    std::normal_distribution<double> n(0, noise);
    return level(i) * std::exp(n(*gen));
  };
}

ProbeCadenceOptions Small() {
  ProbeCadenceOptions o;
  o.every = 5;
  o.steady_every = 25;
  o.watch_probes = 4;
  o.start_probes = 0;  // the watch and steady paces alone
  return o;
}

TEST(ProbeCadenceTest, ProbesEachOfTheFirstIterationsThenWatchesAndSettles) {
  // By default a rank probes on its first five iterations (a speed for the
  // coordinator before its first plan), within the watch, then on at the
  // watched pace while the watch lasts and at the steady pace after.
  ProbeCadenceOptions o;
  o.steady_every = 25;
  ProbeCadence c(o);
  EXPECT_THAT(Probes(c, 0, 100, [](int64_t) { return 0.5; }),
              ElementsAre(0, 1, 2, 3, 4, 9, 14, 19, 24, 29, 34, 39, 64, 89));
  // The start is counted from the first iteration the rank sees.
  o.watch_probes = 4;
  o.start_probes = 3;
  ProbeCadence resumed(o);
  EXPECT_THAT(Probes(resumed, 500, 560, [](int64_t) { return 0.5; }),
              ElementsAre(500, 501, 502, 507, 532, 557));
}

TEST(ProbeCadenceTest, WatchesFromTheStartThenProbesAtTheSteadyPace) {
  ProbeCadence c(Small());
  const auto probes = Probes(c, 0, 130, [](int64_t) { return 0.5; });
  EXPECT_THAT(probes, ElementsAre(0, 5, 10, 15, 40, 65, 90, 115));
  EXPECT_FALSE(c.watching());
}

TEST(ProbeCadenceTest, StartsAtTheFirstIterationItSees) {
  ProbeCadence c(Small());
  EXPECT_THAT(Probes(c, 1000, 1016, [](int64_t) { return 0.5; }),
              ElementsAre(1000, 1005, 1010, 1015));
}

TEST(ProbeCadenceTest, NeverWhenEveryIsZero) {
  ProbeCadenceOptions o = Small();
  o.every = 0;
  o.steady_every = 0;
  ProbeCadence c(o);
  EXPECT_TRUE(Probes(c, 0, 200, [](int64_t i) { return i < 100 ? 0.5 : 1.0; }).empty());
}

TEST(ProbeCadenceTest, AThrottleMidRunIsProbedWithinTheConfirmationsAndWatched) {
  for (unsigned seed = 1; seed <= 8; ++seed) {
    ProbeCadence c(Small());
    // 3% scatter; from iteration 103 the rank runs at half speed.
    const auto probes = Probes(
        c, 0, 160, Noisy([](int64_t i) { return i < 103 ? 0.5 : 1.0; }, 0.03, seed));
    // The steady probes before, then at 104 (two iterations beyond), then a
    // watch of four at the watched pace, then steady again.
    EXPECT_THAT(probes, ElementsAre(0, 5, 10, 15, 40, 65, 90, 104, 109, 114, 119, 144))
        << "seed " << seed;
  }
}

TEST(ProbeCadenceTest, ARecoveryIsWatchedToo) {
  ProbeCadence c(Small());
  const auto probes =
      Probes(c, 0, 100, [](int64_t i) { return i >= 30 && i < 60 ? 1.0 : 0.5; });
  // Down at 30 (probed at 31), back at 60 (probed at 61).
  EXPECT_THAT(probes, ElementsAre(0, 5, 10, 15, 31, 36, 41, 46, 61, 66, 71, 76));
}

TEST(ProbeCadenceTest, ALoneOutlierStartsNoWatch) {
  ProbeCadence c(Small());
  const auto probes = Probes(c, 0, 100, [](int64_t i) {
    return i == 50 || i == 52 || i == 70 ? 3.0 : i == 71 ? 0.1 : 0.5;
  });
  EXPECT_THAT(probes, ElementsAre(0, 5, 10, 15, 40, 65, 90));
}

TEST(ProbeCadenceTest, StationaryNoiseStartsNoWatch) {
  for (unsigned seed = 1; seed <= 8; ++seed) {
    ProbeCadence c(Small());
    const auto probes =
        Probes(c, 0, 5000, Noisy([](int64_t) { return 0.5; }, 0.03, seed));
    EXPECT_EQ(probes.size(), 4u + (5000 - 15 - 1) / 25) << "seed " << seed;
  }
}

TEST(ProbeCadenceTest, APlanThatChangesTheLayersRestartsThePaceWithoutAWatch) {
  ProbeCadence c(Small());
  // At 50 the rank takes on twice the work (a plan moved layers to it).
  const auto probes =
      Probes(c, 0, 100, [](int64_t i) { return i < 50 ? 0.5 : 1.0; }, /*changed_at=*/50);
  EXPECT_THAT(probes, ElementsAre(0, 5, 10, 15, 40, 65, 90));
  EXPECT_FALSE(c.watching());
}

TEST(ProbeCadenceTest, UnmeasuredLayersLeaveOnlyTheSchedule) {
  ProbeCadence c(Small());
  const auto probes = Probes(c, 0, 70, [](int64_t i) {
    return i % 3 == 0 ? 0.0 : i % 3 == 1 ? std::nan("") : -1.0;
  });
  EXPECT_THAT(probes, ElementsAre(0, 5, 10, 15, 40, 65));
}

TEST(ProbeCadenceTest, EqualPacesProbeEveryEveryIterations) {
  ProbeCadenceOptions o = Small();
  o.steady_every = 5;
  ProbeCadence c(o);
  EXPECT_THAT(Probes(c, 0, 31, [](int64_t) { return 0.5; }),
              ElementsAre(0, 5, 10, 15, 20, 25, 30));
}

TEST(ProbeCadenceTest, BadOptionsAreRefusedInOneLine) {
  auto msg = [](auto set) {
    ProbeCadenceOptions o;
    set(o);
    return std::string(ValidateProbeCadenceOptions(o).message());
  };
  EXPECT_TRUE(ValidateProbeCadenceOptions({}).ok());
  EXPECT_THAT(msg([](auto& o) { o.every = -1; }), HasSubstr("every must be >= 0"));
  EXPECT_THAT(msg([](auto& o) { o.start_probes = -1; }), HasSubstr("start_probes"));
  EXPECT_THAT(msg([](auto& o) { o.steady_every = 2; }), HasSubstr("steady_every must be >="));
  EXPECT_THAT(msg([](auto& o) { o.watch_probes = 0; }), HasSubstr("watch_probes"));
  EXPECT_THAT(msg([](auto& o) { o.min_change = std::nan(""); }), HasSubstr("min_change"));
  EXPECT_THAT(msg([](auto& o) { o.sigmas = -1; }), HasSubstr("sigmas"));
  EXPECT_THAT(msg([](auto& o) { o.confirmations = 0; }), HasSubstr("confirmations"));
  EXPECT_THAT(msg([](auto& o) { o.smoothing = 0; }), HasSubstr("smoothing"));
}

}  // namespace
}  // namespace dynmo::core
