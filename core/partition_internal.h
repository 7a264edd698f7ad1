// Internal to core: the exact partitioner with a generalised
// tie-break, shared by partition_optimal.cc and repack.cc. Not a public API.
#ifndef DYNMO_CORE_PARTITION_INTERNAL_H_
#define DYNMO_CORE_PARTITION_INTERNAL_H_

#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/boundaries.h"
#include "core/cost_model.h"

namespace dynmo::core::internal {

// The layers each stage holds now: stage s owns [first, second) (may be empty
// or absent for a stage that owns nothing). Empty vector = no current layout.
using CurrentRanges = std::vector<std::pair<int, int>>;

struct ExactPartition {
  Boundaries boundaries;
  double bottleneck = 0;
  int64_t kept_bytes = 0;  // resident bytes that stay on their stage
};

// Exact minimum bottleneck; among optimal partitions, the one keeping the most
// resident bytes on the stage that owns them in `current`. With
// `near_tie` > 0 (and a current layout), among the partitions whose
// bottleneck is within that fraction of the minimum.
absl::StatusOr<ExactPartition> SolveExact(const PipelineModel& model,
                                          const CurrentRanges& current,
                                          double near_tie = 0);

CurrentRanges RangesOf(const Boundaries& b);

}  // namespace dynmo::core::internal

#endif  // DYNMO_CORE_PARTITION_INTERNAL_H_
