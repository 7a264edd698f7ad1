// Re-packing arithmetic of dynmo-train: how a layout change that may release
// pipeline stages maps onto the ranks that run the job. Pure (no LibTorch,
// no I/O), so it is unit-tested on its own.
//
// Stage ids are the ORIGINAL pipeline ranks 0..pp-1 (proto/dynmo/v1/plan.proto);
// a layout is the list of active stage ids in pipeline order plus boundaries
// over them. The ranks currently running the job are numbered by position:
// the rank of (active index i, dp replica d) is i * dp + d, exactly
// config.h's layout over the active stages. A step from one layout to the next:
//   1. migrates layers over the CURRENT ranks. Every stage of the new layout
//      is one of the current ones, so the move list is expressed in current
//      active indices, and a released stage simply ends with no layers
//      (`expanded_to` has an empty range for it);
//   2. renumbers the survivors: current active index i -> new index
//      `new_index[i]` (-1 = released), current rank r -> `new_rank[r]`.
// A released stage releases all its dp replicas.
#ifndef DYNMO_TRAINER_LAYOUT_REPACK_LAYOUT_H_
#define DYNMO_TRAINER_LAYOUT_REPACK_LAYOUT_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/boundaries.h"

namespace dynmo::trainer {

struct StageLayout {
  std::vector<int> active_stages;  // original stage ids, pipeline order
  core::Boundaries boundaries;     // over active_stages, size active + 1
};

// The identity layout of a job that starts with `pp` stages.
StageLayout InitialLayout(int pp, const core::Boundaries& boundaries);

struct RepackStep {
  StageLayout from;
  StageLayout to;
  // Per current active index: its index in `to`, or -1 when released.
  std::vector<int> new_index;
  // `to`'s boundaries over the CURRENT active indices (released: empty).
  core::Boundaries expanded_to;
  // Per current rank (i * dp + d): its rank after the step, -1 if released.
  std::vector<int> new_rank;
  // Per layer: current active index that owns it before / after the step.
  std::vector<int> owner_before;
  std::vector<int> owner_after;

  bool releases() const { return to.active_stages.size() < from.active_stages.size(); }
};

// Validates `to` against `from` (its active stages a non-empty subsequence of
// `from`'s, boundaries partitioning `num_layers` layers with no empty stage)
// and derives the step. Errors say what is wrong.
absl::StatusOr<RepackStep> PlanRepackStep(const StageLayout& from,
                                          const StageLayout& to, int num_layers,
                                          int dp);

// A test-policy target: "b0,...,bk" (over the active stages) or
// "s0,s1,...@b0,...,bk" (the active stage ids, then boundaries over them).
struct LayoutTarget {
  std::vector<int> active_stages;  // empty: keep the active stages
  core::Boundaries boundaries;
};
absl::StatusOr<LayoutTarget> ParseLayoutTarget(absl::string_view text);

// `target` applied to `current`: its stages, or `current`'s when it names none.
StageLayout ResolveTarget(const StageLayout& current, const LayoutTarget& target);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_LAYOUT_REPACK_LAYOUT_H_
