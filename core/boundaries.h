// Boundaries: the layer-to-stage assignment of a pipeline, in DeepSpeed's
// `parts` convention. For S stages over N layers, b has S+1 entries,
// b[0] = 0, b[S] = N, and stage s holds layers [b[s], b[s+1]). Every
// partitioner in this library returns strictly increasing boundaries, so no
// stage is ever empty and layer order is always kept.
#ifndef DYNMO_CORE_BOUNDARIES_H_
#define DYNMO_CORE_BOUNDARIES_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace dynmo::core {

using Boundaries = std::vector<int>;

// Returns OK when `b` is a valid partition of `num_layers` layers into
// `num_stages` non-empty contiguous stages.
absl::Status ValidateBoundaries(absl::Span<const int> b, int num_layers,
                                int num_stages);

// Returns the stage that holds `layer` (binary search; b must be valid).
int StageOfLayer(absl::Span<const int> b, int layer);

}  // namespace dynmo::core

#endif  // DYNMO_CORE_BOUNDARIES_H_
