#include "trainer/repack.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/core/migration.h"

namespace dynmo::trainer {

absl::StatusOr<RepackStep> StepForPlan(const dynmo::v1::Plan& plan,
                                       const StageLayout& current, int num_layers,
                                       int dp) {
  StageLayout to;
  to.active_stages.assign(plan.active_stages().begin(), plan.active_stages().end());
  if (to.active_stages.empty()) to.active_stages = current.active_stages;
  to.boundaries.assign(plan.boundaries().begin(), plan.boundaries().end());
  for (int s : plan.released_stages()) {
    for (int a : to.active_stages) {
      if (a == s) {
        return absl::InvalidArgumentError(
            absl::StrCat("stage ", s, " is both active and released"));
      }
    }
  }
  absl::StatusOr<RepackStep> step = PlanRepackStep(current, to, num_layers, dp);
  if (!step.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan (active stages ", absl::StrJoin(to.active_stages, ","), ", boundaries ",
        absl::StrJoin(to.boundaries, ","), "): ", step.status().message()));
  }
  return step;
}

absl::Status ApplyLayoutStep(const RepackStep& step,
                             absl::Span<const core::LayerCost> layer_costs,
                             PipelineStage& stage,
                             std::unique_ptr<Transport>* transport) {
  // Moves in current active indices: every destination is a running stage.
  absl::StatusOr<core::MigrationPlan> moves =
      core::PlanMigration(layer_costs, step.owner_before, step.owner_after);
  if (!moves.ok()) return moves.status();
  if (absl::Status s = stage.ApplyMigration(*moves, step.expanded_to); !s.ok()) {
    return s;
  }
  if (!step.releases()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<Transport>> shrunk = (*transport)->Shrink(step.new_rank);
  if (!shrunk.ok()) return shrunk.status();
  if (*shrunk != nullptr) {
    const int me = (*shrunk)->rank();
    const int dp = static_cast<int>(step.new_rank.size() / step.from.active_stages.size());
    stage.Rebind(me / dp, static_cast<int>(step.to.active_stages.size()), shrunk->get());
  }
  *transport = *std::move(shrunk);
  return absl::OkStatus();
}

}  // namespace dynmo::trainer
