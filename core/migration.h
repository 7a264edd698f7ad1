// Migration plans: the layer moves that turn one assignment into another.
// Each move names the layer, its source and destination stage (in the
// original stage numbering, so re-packing plans that release stages use the
// same ids) and the resident bytes it carries (weights, grads, optimizer
// state). Moves are grouped into rounds in which every stage sends or
// receives at most one layer; executing the list in order (round by round) as
// blocking point-to-point send/recv pairs cannot deadlock, because every rank
// walks the same global order and the earliest pending move always has both
// of its endpoints waiting on it.
#ifndef DYNMO_CORE_MIGRATION_H_
#define DYNMO_CORE_MIGRATION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/boundaries.h"
#include "core/cost_model.h"

namespace dynmo::core {

struct LayerMigration {
  int layer = 0;
  int from_stage = 0;
  int to_stage = 0;
  int64_t bytes = 0;
  int round = 0;
};

struct MigrationPlan {
  std::vector<LayerMigration> migrations;  // sorted by (round, layer)
  int64_t total_bytes = 0;
  int rounds = 0;
};

// The stage of every layer under boundaries `b`, where the i-th range of `b`
// belongs to stage_ids[i] (identity when stage_ids is empty).
std::vector<int> LayerOwners(absl::Span<const int> b,
                             absl::Span<const int> stage_ids = {});

// Moves from owner map `from` to owner map `to` (both one entry per layer).
absl::StatusOr<MigrationPlan> PlanMigration(absl::Span<const LayerCost> layers,
                                            absl::Span<const int> from,
                                            absl::Span<const int> to);

// Convenience: both assignments as boundaries over the same stages.
absl::StatusOr<MigrationPlan> PlanMigrationBetween(
    absl::Span<const LayerCost> layers, absl::Span<const int> from_b,
    absl::Span<const int> to_b);

}  // namespace dynmo::core

#endif  // DYNMO_CORE_MIGRATION_H_
