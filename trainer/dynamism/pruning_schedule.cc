#include "trainer/dynamism/pruning_schedule.h"

namespace dynmo::trainer {

bool IsPruningStep(const PruningConfig& c, int64_t t) {
  return c.every >= 1 && t >= c.start && t <= c.end && (t - c.start) % c.every == 0;
}

double TargetSparsity(const PruningConfig& c, int64_t t) {
  if (t < c.start) return 0;
  if (t >= c.end) return c.final_sparsity;
  const double progress =
      static_cast<double>(t - c.start) / static_cast<double>(c.end - c.start);
  const double remaining = 1.0 - progress;
  return c.final_sparsity +
         (c.initial_sparsity - c.final_sparsity) * remaining * remaining * remaining;
}

}  // namespace dynmo::trainer
