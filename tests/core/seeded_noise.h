// Lcg: a seeded linear congruential generator for the core's tests, so
// that their noise is the same on every run (unit tests are deterministic).
// Thread-compatible.
#ifndef DYNMO_TESTS_CORE_SEEDED_NOISE_H_
#define DYNMO_TESTS_CORE_SEEDED_NOISE_H_

#include <cstdint>

namespace dynmo::core {

class Lcg {
 public:
  explicit Lcg(uint64_t seed) : x_(seed) {}
  // Uniform in [-1, 1).
  double Next() {
    x_ = x_ * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(x_ >> 11) / static_cast<double>(1ULL << 52) - 1.0;
  }

 private:
  uint64_t x_;
};

}  // namespace dynmo::core

#endif  // DYNMO_TESTS_CORE_SEEDED_NOISE_H_
