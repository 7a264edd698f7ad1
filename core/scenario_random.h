// Random numbers for the scenario generator that are the same on every
// platform for a given seed.
//
// std::mt19937_64's raw output is fixed by the C++ standard, but the standard
// distributions (uniform_real_distribution, normal_distribution) are not: each
// library may turn the bits into numbers its own way. So the generator draws
// raw 64-bit words and converts them here: a uniform double from the top 53
// bits, a normal by Box-Muller. Independent streams (one for per-layer traits,
// one per noise source) come from mixing the seed with a stream number, so
// adding iterations never changes a layer's traits. Not thread-safe; give
// each thread its own object.
#ifndef DYNMO_CORE_SCENARIO_RANDOM_H_
#define DYNMO_CORE_SCENARIO_RANDOM_H_

#include <cstdint>
#include <random>

namespace dynmo::core {

class ScenarioRandom {
 public:
  // The stream `stream` of generator `seed`.
  ScenarioRandom(uint64_t seed, uint64_t stream);

  // Uniform on [0, 1), a multiple of 2^-53.
  double Uniform();
  // Standard normal (Box-Muller over two Uniform() draws).
  double Normal();

 private:
  std::mt19937_64 engine_;
};

}  // namespace dynmo::core

#endif  // DYNMO_CORE_SCENARIO_RANDOM_H_
