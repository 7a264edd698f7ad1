#include "core/scenario_random.h"

#include <cmath>

namespace dynmo::core {
namespace {

// SplitMix64's finaliser: spreads nearby seeds and stream numbers far apart,
// so (seed 1, stream 2) and (seed 2, stream 1) do not share an engine state.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

ScenarioRandom::ScenarioRandom(uint64_t seed, uint64_t stream)
    : engine_(Mix(seed ^ Mix(stream))) {}

double ScenarioRandom::Uniform() {
  return static_cast<double>(engine_() >> 11) * 0x1.0p-53;
}

double ScenarioRandom::Normal() {
  const double u1 = 1.0 - Uniform();  // (0, 1]: log stays finite
  const double u2 = Uniform();
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

}  // namespace dynmo::core
