// Partitioners: each turns a PipelineModel into Boundaries (boundaries.h):
// stage s holds layers [b[s], b[s+1]), every stage non-empty, layer order kept.
//
//   uniform     Megatron/DeepSpeed partition_uniform: the first n mod k stages
//               get one extra layer.
//   parameters  exact minimum bottleneck of parameter counts (DeepSpeed's
//               default partition_method), ignoring speeds and caps.
//   time        exact minimum bottleneck of measured time (the paper's
//               "partition by time"), ignoring speeds and caps.
//   optimal     EXACT minimum bottleneck of measured time honouring per-stage
//               speeds, memory caps and the link; among all partitions with
//               that bottleneck, the one that moves the fewest resident bytes
//               away from `current`. Cross-checked against brute force.
//   diffusion   the paper's Algorithm 3, restricted to neighbour moves so the
//               result stays contiguous; heuristic, reports its rounds.
// Pure functions of their inputs; thread-compatible.
#ifndef DYNMO_CORE_PARTITION_H_
#define DYNMO_CORE_PARTITION_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/boundaries.h"
#include "core/cost_model.h"

namespace dynmo::core {

enum class PartitionMethod { kUniform, kParameters, kTime, kOptimal, kDiffusion };

// "uniform", "parameters", "time", "optimal", "diffusion".
absl::StatusOr<PartitionMethod> ParsePartitionMethod(absl::string_view name);
std::string PartitionMethodName(PartitionMethod method);

struct PartitionOptions {
  PartitionMethod method = PartitionMethod::kOptimal;
  // Where the layers are now. `optimal` breaks ties toward it; `diffusion`
  // starts from it (uniform when absent).
  std::optional<Boundaries> current;
  // `optimal` with a current layout: a partition whose bottleneck is within
  // this fraction of the minimum counts as a tie, so the one moving the
  // fewest resident bytes among them wins (measured costs carry noise; 0:
  // exact ties only). Finite, >= 0.
  double near_tie = 0;
  int diffusion_max_rounds = 1000;
};

struct PartitionResult {
  Boundaries boundaries;
  int diffusion_rounds = 0;         // rounds that moved a layer (diffusion)
  bool diffusion_converged = true;  // stopped because no move helped
};

// Runs the chosen partitioner. Errors: invalid model, more stages than
// layers, invalid `current`, or memory caps that no partition satisfies.
absl::StatusOr<PartitionResult> Partition(const PipelineModel& model,
                                          const PartitionOptions& options);

// partition_uniform. Precondition: 1 <= num_stages <= num_layers.
Boundaries PartitionUniform(int num_layers, int num_stages);

// Exact minimum-bottleneck contiguous partition of non-negative weights into
// num_stages non-empty parts (unit speeds, no caps). Ties broken toward the
// earliest boundaries.
absl::StatusOr<Boundaries> PartitionMinBottleneck(
    absl::Span<const double> weights, int num_stages);

// The `optimal` method on its own; `current` may be null. `near_tie`:
// PartitionOptions::near_tie.
absl::StatusOr<Boundaries> PartitionOptimal(const PipelineModel& model,
                                            const Boundaries* current,
                                            double near_tie = 0);

// The smallest achievable bottleneck (StageTime of the slowest stage) over
// all feasible partitions, found exactly; NotFound-free: infeasible caps give
// InvalidArgument naming the layer or stage that cannot be placed.
absl::StatusOr<double> OptimalBottleneck(const PipelineModel& model);

// The diffusion balancer on its own, starting from `start`.
absl::StatusOr<PartitionResult> PartitionDiffusion(const PipelineModel& model,
                                                   const Boundaries& start,
                                                   int max_rounds);

}  // namespace dynmo::core

#endif  // DYNMO_CORE_PARTITION_H_
