// The paper's diffusion balancer (Algorithm 3), kept contiguous.
//
// In the paper an overloaded stage (load above the mean) sends its lightest
// layer to the least-loaded rank, which breaks layer order. Here the layer
// travels there along the chain instead: every stage between the two passes
// one boundary layer to its neighbour in that direction, so each layer crosses
// exactly one boundary and order is kept. If that cascade is rejected the
// stage tries its direct neighbours. A move is accepted, as in the paper, when
// it lowers the variance of stage loads and every receiving stage's memory cap
// still holds. Single hops alone get stuck on "staircases" (loads 5,4,4,3 of
// unit layers: no one-layer move lowers the variance); the cascade does not.
// Rounds end when no stage moves (converged) or after max_rounds.
#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/measures.h"
#include "core/partition.h"

namespace dynmo::core {
namespace {

double Variance(const std::vector<double>& v) {
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  double acc = 0;
  for (double x : v) acc += (x - mean) * (x - mean);
  return acc / v.size();
}

}  // namespace

absl::StatusOr<PartitionResult> PartitionDiffusion(const PipelineModel& model,
                                                   const Boundaries& start,
                                                   int max_rounds) {
  if (absl::Status st = ValidateModel(model); !st.ok()) return st;
  const int n = static_cast<int>(model.layers.size());
  const int k = static_cast<int>(model.stages.size());
  if (absl::Status st = ValidateBoundaries(start, n, k); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("diffusion start partition: ", st.message()));
  }
  if (max_rounds < 0) {
    return absl::InvalidArgumentError("diffusion rounds must be >= 0");
  }
  const LayerPrefix prefix(model.layers);
  auto load = [&](const Boundaries& b, int s) {
    return StageTime(prefix, model.stages[s], model.link, s, k, b[s], b[s + 1]);
  };
  PartitionResult result;
  result.boundaries = start;
  result.diffusion_converged = false;
  Boundaries& b = result.boundaries;
  std::vector<double> loads = StageLoads(model, b);
  for (int round = 0; round < max_rounds; ++round) {
    const double mean = std::accumulate(loads.begin(), loads.end(), 0.0) / k;
    bool moved = false;
    for (int s = 0; s < k; ++s) {
      if (loads[s] <= mean || b[s + 1] - b[s] < 2) continue;
      const int lightest = static_cast<int>(
          std::min_element(loads.begin(), loads.end()) - loads.begin());
      std::vector<int> targets = {lightest};
      if (s > 0 && s - 1 != lightest) targets.push_back(s - 1);
      if (s + 1 < k && s + 1 != lightest) targets.push_back(s + 1);
      for (int t : targets) {
        if (t == s) continue;
        // Shift every boundary between s and t one layer toward t.
        Boundaries trial = b;
        const int lo = std::min(s, t), hi = std::max(s, t);
        for (int x = lo + 1; x <= hi; ++x) trial[x] += (t > s) ? -1 : 1;
        std::vector<double> trial_loads = loads;
        bool fits = true;
        for (int m = lo; m <= hi && fits; ++m) {
          trial_loads[m] = load(trial, m);
          fits = m == s ||
                 FitsMemory(prefix, model.stages[m], trial[m], trial[m + 1]);
        }
        if (fits && Variance(trial_loads) < Variance(loads)) {
          b = std::move(trial);
          loads = std::move(trial_loads);
          moved = true;
          break;
        }
      }
    }
    if (!moved) {
      result.diffusion_converged = true;
      break;
    }
    ++result.diffusion_rounds;
  }
  return result;
}

}  // namespace dynmo::core
