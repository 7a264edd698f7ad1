#include "trainer/elastic/plan_step.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dynmo::trainer {
namespace {

// Index of original stage `stage` in `active`, or -1.
int IndexOf(const std::vector<int>& active, int stage) {
  for (size_t i = 0; i < active.size(); ++i) {
    if (active[i] == stage) return static_cast<int>(i);
  }
  return -1;
}

absl::StatusOr<core::MigrationPlan> PlanMoves(const wire::Plan& plan,
                                              const RepackStep& step) {
  const std::vector<int>& active = step.from.active_stages;
  const int layers = static_cast<int>(step.owner_before.size());
  core::MigrationPlan moves;
  std::vector<bool> moved(static_cast<size_t>(layers), false);
  std::set<std::pair<int, int>> busy;  // (round, stage index)
  for (const core::LayerMigration& m : plan.migrations) {
    const std::string what = absl::StrCat("move of layer ", m.layer, " from stage ",
                                          m.from_stage, " to ", m.to_stage);
    if (m.layer < 0 || m.layer >= layers) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": no such layer"));
    }
    const int from = IndexOf(active, m.from_stage);
    const int to = IndexOf(active, m.to_stage);
    if (from < 0 || to < 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": not a running stage"));
    }
    const size_t l = static_cast<size_t>(m.layer);
    if (moved[l]) return absl::InvalidArgumentError(absl::StrCat(what, ": moved twice"));
    moved[l] = true;
    if (step.owner_before[l] != from || step.owner_after[l] != to) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": the layout moves it from stage ",
          active[static_cast<size_t>(step.owner_before[l])], " to ",
          active[static_cast<size_t>(step.owner_after[l])]));
    }
    if (m.round < 0 || !busy.insert({m.round, from}).second ||
        !busy.insert({m.round, to}).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": round ", m.round, " uses a stage twice"));
    }
    moves.migrations.push_back({m.layer, from, to, m.bytes, m.round});
    moves.total_bytes += m.bytes;
    moves.rounds = std::max(moves.rounds, m.round + 1);
  }
  for (int l = 0; l < layers; ++l) {
    const size_t i = static_cast<size_t>(l);
    if (!moved[i] && step.owner_before[i] != step.owner_after[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the plan's migrations leave layer ", l, " on stage ",
          active[static_cast<size_t>(step.owner_before[i])],
          " but its layout puts it on stage ",
          active[static_cast<size_t>(step.owner_after[i])]));
    }
  }
  std::stable_sort(moves.migrations.begin(), moves.migrations.end(),
                   [](const core::LayerMigration& a, const core::LayerMigration& b) {
                     return a.round != b.round ? a.round < b.round : a.layer < b.layer;
                   });
  return moves;
}

absl::Status CheckSplit(const wire::Plan& plan, const RepackStep& step) {
  if (plan.split.empty()) return absl::OkStatus();
  std::map<int, const core::CommSplit*> by_stage;
  for (const core::CommSplit& c : plan.split) {
    if (!by_stage.emplace(c.stage, &c).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("the split names stage ", c.stage, " twice"));
    }
  }
  for (size_t i = 0; i < step.from.active_stages.size(); ++i) {
    const int stage = step.from.active_stages[i];
    const int key = step.new_index[i];
    auto it = by_stage.find(stage);
    if (it == by_stage.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the split leaves out running stage ", stage));
    }
    const int want_color = key < 0 ? core::kReleasedColor : 0;
    if (it->second->color != want_color || it->second->key != key) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the split puts stage ", stage, " at colour ", it->second->color, " key ",
          it->second->key, " but the layout at colour ", want_color, " key ", key));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RepackStep> StepForPlan(const wire::Plan& plan,
                                       const StageLayout& current, int num_layers,
                                       int dp) {
  StageLayout to;
  to.active_stages = plan.active_stages;
  if (to.active_stages.empty()) to.active_stages = current.active_stages;
  to.boundaries = plan.boundaries;
  for (int s : plan.released_stages) {
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

absl::StatusOr<PlanExecution> ExecutionForPlan(
    const wire::Plan& plan, const StageLayout& current, int num_layers, int dp,
    absl::Span<const core::LayerCost> layer_costs) {
  absl::StatusOr<RepackStep> step = StepForPlan(plan, current, num_layers, dp);
  if (!step.ok()) return step.status();
  if (absl::Status s = CheckSplit(plan, *step); !s.ok()) return s;
  absl::StatusOr<core::MigrationPlan> moves =
      plan.migrations.empty()
          ? core::PlanMigration(layer_costs, step->owner_before, step->owner_after)
          : PlanMoves(plan, *step);
  if (!moves.ok()) return moves.status();
  return PlanExecution{*std::move(step), *std::move(moves)};
}

absl::StatusOr<ReshapeStep> ReshapeForPlan(const wire::Plan& plan,
                                           const StageLayout& current, int dp,
                                           int microbatches, int num_layers) {
  if (!plan.reshape) {
    return absl::InvalidArgumentError("not a re-shaping plan (no reshape)");
  }
  const wire::Reshape& r = *plan.reshape;
  const std::string what = absl::StrCat("re-shaping plan (pp ", r.pipeline_size,
                                        " x dp ", r.data_parallel_size, ")");
  if (!plan.migrations.empty() || !plan.split.empty() || !plan.released_stages.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " carries ", plan.migrations.size(), " migrations, ", plan.split.size(),
        " split entries and ", plan.released_stages.size(),
        " released stages; a re-shape has none"));
  }
  if (!plan.active_stages.empty()) {
    bool renumbered = static_cast<int>(plan.active_stages.size()) == r.pipeline_size;
    for (size_t i = 0; renumbered && i < plan.active_stages.size(); ++i) {
      renumbered = plan.active_stages[i] == static_cast<int>(i);
    }
    if (!renumbered) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": active stages ", absl::StrJoin(plan.active_stages, ","),
          " must be 0..", r.pipeline_size - 1));
    }
  }
  ReshapeTarget target;
  target.pp = r.pipeline_size;
  target.dp = r.data_parallel_size;
  target.boundaries = plan.boundaries;
  if (target.boundaries.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has no boundaries"));
  }
  absl::StatusOr<ReshapeStep> step =
      PlanReshapeStep(current, dp, microbatches, target, num_layers);
  if (!step.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", step.status().message()));
  }
  return step;
}

}  // namespace dynmo::trainer
