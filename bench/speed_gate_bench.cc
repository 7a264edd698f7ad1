// dynmo-bench-speed-gate: how the per-rank speed estimate (core::RankSpeeds)
// trades false alarms against finding a straggler, on synthetic probes of
// two ranks with seeded noise (uniform, of the given standard deviation,
// optionally with heavy-tailed stalls: 2% of probes 1.5-2.5x longer).
// Deterministic; prints one Markdown table row per noise setting:
//   - false publishes per 2,000 probes on equal ranks (1,000 rounds),
//   - for a rank slow from the start at 0.6 / 0.7 / 0.8: the share of
//     seeds that publish it within 120 rounds, the median round it is
//     first published at, and the median final published speed,
//   - for a rank that runs at 0.5 or 0.7 over rounds 100-250: the median
//     rounds until the published speed is past half-way down, and back up
//     ("> 150": not within the 150 rounds each way).
// Usage: dynmo-bench-speed-gate [SEEDS]   (200 by default)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/rank_speed.h"
#include "tests/core/seeded_noise.h"

namespace {

using dynmo::core::Lcg;
using dynmo::core::RankSpeedOptions;
using dynmo::core::RankSpeeds;

class Noise {
 public:
  Noise(uint64_t seed, double sd, bool stalls) : rng_(seed), sd_(sd), stalls_(stalls) {}
  // A probe of `base` seconds as the rank would time it.
  double Probe(double base) {
    double t = base * (1 + sd_ * 1.7320508 * rng_.Next());  // uniform, sd `sd_`
    if (stalls_ && rng_.Next() > 0.96) t *= 2 + 0.5 * rng_.Next();
    return t;
  }

 private:
  Lcg rng_;  // the core tests' seeded generator, uniform in [-1, 1)
  double sd_;
  bool stalls_;
};

int Median(std::vector<int> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Row(int seeds, double sd, bool stalls) {
  const RankSpeedOptions options;
  constexpr double kProbe = 0.010;
  // Equal ranks.
  long publishes = 0, probes = 0;
  for (int seed = 1; seed <= seeds; ++seed) {
    RankSpeeds s(2, options);
    Noise n(static_cast<uint64_t>(seed), sd, stalls);
    for (int i = 0; i < 1000; ++i) {
      publishes += s.AddProbe(0, n.Probe(kProbe)) ? 1 : 0;
      publishes += s.AddProbe(1, n.Probe(kProbe)) ? 1 : 0;
      probes += 2;
    }
  }
  char cell[96];
  std::snprintf(cell, sizeof cell, "%.0f%%%s", sd * 100, stalls ? " + stalls" : "");
  std::string row = cell;
  std::snprintf(cell, sizeof cell, " | %.2f", 2000.0 * static_cast<double>(publishes) /
                                              static_cast<double>(probes));
  row += cell;
  // Slow from the start.
  for (double speed : {0.6, 0.7, 0.8}) {
    std::vector<int> when;
    std::vector<double> final_speed;
    for (int seed = 1; seed <= seeds; ++seed) {
      RankSpeeds s(2, options);
      Noise n(static_cast<uint64_t>(seed) * 977, sd, stalls);
      int first = -1;
      for (int i = 0; i < 120; ++i) {
        s.AddProbe(0, n.Probe(kProbe));
        s.AddProbe(1, n.Probe(kProbe / speed));
        if (first < 0 && s.speed(1) < 1) first = i;
      }
      if (first >= 0) when.push_back(first);
      final_speed.push_back(s.speed(1));
    }
    std::sort(final_speed.begin(), final_speed.end());
    std::snprintf(cell, sizeof cell, " | %d%%, %d, %.2f",
                  static_cast<int>(100 * when.size() / static_cast<size_t>(seeds)),
                  Median(when), final_speed[final_speed.size() / 2]);
    row += cell;
  }
  // Slowed over rounds 100-250.
  for (double speed : {0.5, 0.7}) {
    std::vector<int> down, up;
    const double half = 1 - (1 - speed) / 2;
    for (int seed = 1; seed <= seeds; ++seed) {
      RankSpeeds s(2, options);
      Noise n(static_cast<uint64_t>(seed) * 31, sd, stalls);
      int d = 999, u = 999;
      for (int i = 0; i < 400; ++i) {
        const bool slowed = i >= 100 && i < 250;
        s.AddProbe(0, n.Probe(kProbe));
        s.AddProbe(1, n.Probe(kProbe / (slowed ? speed : 1.0)));
        if (slowed && d == 999 && s.speed(1) < half) d = i - 100;
        if (i >= 250 && u == 999 && s.speed(1) > half) u = i - 250;
      }
      down.push_back(d);
      up.push_back(u);
    }
    auto text = [](int rounds) {
      return rounds >= 999 ? std::string("> 150") : std::to_string(rounds);
    };
    std::snprintf(cell, sizeof cell, " | %s, %s", text(Median(down)).c_str(),
                  text(Median(up)).c_str());
    row += cell;
  }
  std::printf("| %s |\n", row.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const int seeds = argc > 1 ? std::atoi(argv[1]) : 200;
  if (seeds < 1 || seeds > 100000) {
    std::fprintf(stderr, "dynmo-bench-speed-gate: SEEDS must be in [1, 100000]\n");
    return 2;
  }
  std::printf("%d seeds, 2 ranks, one probe each per round; defaults of RankSpeedOptions\n\n",
              seeds);
  std::printf(
      "| probe noise (sd) | false publishes / 2,000 probes, equal ranks | 0.6 from the "
      "start: published, median round, final | 0.7 | 0.8 | 0.5 over rounds 100-250: rounds "
      "down, up | 0.7 |\n|---|---:|---|---|---|---|---|\n");
  for (double sd : {0.05, 0.15, 0.20}) {
    for (bool stalls : {false, true}) Row(seeds, sd, stalls);
  }
  return 0;
}
