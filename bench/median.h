// Median of a benchmark's repeated timings (the upper median for an even
// count). Header-only; pure.
#ifndef DYNMO_BENCH_MEDIAN_H_
#define DYNMO_BENCH_MEDIAN_H_

#include <algorithm>
#include <vector>

namespace dynmo::bench {

// The median of `v` (which must not be empty).
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace dynmo::bench

#endif  // DYNMO_BENCH_MEDIAN_H_
