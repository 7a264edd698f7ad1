// A coordinator plan (wire::Plan, as the agent hands it over) read as what
// every rank executes: either a re-shape of
// the pp x dp grid (ReshapeForPlan, below), or the layout step (new
// active stages and boundaries from the current layout, repack_layout.h)
// and the layer moves exactly as the coordinator sent them — Plan.migrations
// in their rounds, renamed from original stage ids to the current active
// indices PipelineStage::ApplyMigration walks — and Plan.split, which must
// number the survivors as the step does. The trainer does not recompute
// either; it checks them, and refuses a plan whose moves do not carry
// exactly the step's change of owners (each moved layer once, from its
// owner to its new owner, no stage twice in a round) or whose split
// disagrees. A plan with no migration list (none needed, or an older
// coordinator) gets the moves core::PlanMigration derives.
//
// Pure (no LibTorch, no I/O); every rank checks the same plan alike, so all
// accept or refuse it together.
#ifndef DYNMO_TRAINER_ELASTIC_PLAN_STEP_H_
#define DYNMO_TRAINER_ELASTIC_PLAN_STEP_H_

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/cost_model.h"
#include "core/migration.h"
#include "core/repack.h"
#include "trainer/layout/repack_layout.h"
#include "trainer/layout/reshape_layout.h"
#include "wire/plan_codec.h"

namespace dynmo::trainer {

// The layout a plan asks for (active_stages empty: the running ones), as a
// step from `current`. Errors are the reason to refuse the plan.
absl::StatusOr<RepackStep> StepForPlan(const wire::Plan& plan,
                                       const StageLayout& current, int num_layers,
                                       int dp);

struct PlanExecution {
  RepackStep step;
  core::MigrationPlan moves;  // over the current active indices, in order
};

// StepForPlan plus the plan's own moves, checked as above. `layer_costs`
// (bytes per layer) is used only when the plan carries no migration list.
absl::StatusOr<PlanExecution> ExecutionForPlan(
    const wire::Plan& plan, const StageLayout& current, int num_layers, int dp,
    absl::Span<const core::LayerCost> layer_costs);

// A re-shaping plan (`reshape` set, plan.proto's Reshape) as the step every
// rank executes: pp' x dp' from the running layout (dp replicas, each
// running `microbatches` micro-batches). Refused unless it keeps the
// contract: pp' * dp' = the running ranks, active_stages = 0..pp'-1 (or
// empty), boundaries over pp', no released stage, no migration list and no
// split (the copies follow from the grid alone), dp' dividing the global
// micro-batches.
absl::StatusOr<ReshapeStep> ReshapeForPlan(const wire::Plan& plan,
                                           const StageLayout& current, int dp,
                                           int microbatches, int num_layers);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_ELASTIC_PLAN_STEP_H_
