#include "coordinator/service/decision.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/core/measures.h"
#include "coordinator/core/partition.h"

namespace dynmo::service {
namespace {

int OriginalId(const std::vector<int>& active, int model_stage) {
  return active[static_cast<size_t>(model_stage)];
}

std::vector<core::CommSplit> IdentitySplit(const std::vector<int>& active) {
  std::vector<core::CommSplit> split;
  for (size_t i = 0; i < active.size(); ++i) {
    split.push_back({active[i], 0, static_cast<int>(i)});
  }
  return split;
}

}  // namespace

absl::StatusOr<Decision> Decide(const DecisionInput& input) {
  const int num_stages = static_cast<int>(input.model.stages.size());
  if (static_cast<int>(input.active_stages.size()) != num_stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("decision: ", input.active_stages.size(),
                     " active stage ids for ", num_stages, " model stages"));
  }
  if (absl::Status s = core::ValidateModel(input.model); !s.ok()) return s;
  const int num_layers = static_cast<int>(input.model.layers.size());
  if (absl::Status s =
          core::ValidateBoundaries(input.current, num_layers, num_stages);
      !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("decision: current layout: ", s.message()));
  }

  Decision d;
  d.current_bottleneck_s =
      core::Bottleneck(core::StageLoads(input.model, input.current));

  if (input.policy.repack && num_stages > 1) {
    core::RepackOptions ro;
    ro.tolerance = input.policy.repack_tolerance;
    ro.current = input.current;
    if (input.full_stages > num_stages) {
      core::PipelineModel full = input.model;
      full.stages.assign(static_cast<size_t>(input.full_stages), input.model.stages[0]);
      absl::StatusOr<double> best = core::OptimalBottleneck(full);
      if (best.ok() && *best > 0) ro.reference_bottleneck = *best;
    }
    absl::StatusOr<core::RepackResult> r = core::RepackOptimal(input.model, ro);
    if (!r.ok()) return r.status();
    if (!r->released_stages.empty()) {
      d.changes_layout = true;
      d.boundaries = r->boundaries;
      for (int s : r->active_stages) {
        d.active_stages.push_back(OriginalId(input.active_stages, s));
      }
      for (int s : r->released_stages) {
        d.released_stages.push_back(OriginalId(input.active_stages, s));
      }
      for (core::LayerMigration m : r->migration.migrations) {
        m.from_stage = OriginalId(input.active_stages, m.from_stage);
        m.to_stage = OriginalId(input.active_stages, m.to_stage);
        d.migrations.push_back(m);
      }
      for (core::CommSplit c : r->split) {
        c.stage = OriginalId(input.active_stages, c.stage);
        d.split.push_back(c);
      }
      d.migration_bytes = r->migration.total_bytes;
      d.predicted_bottleneck_s = r->bottleneck;
      return d;
    }
  }

  core::PartitionOptions po;
  po.method = input.policy.balancer;
  po.current = input.current;
  absl::StatusOr<core::PartitionResult> p = core::Partition(input.model, po);
  if (!p.ok()) return p.status();
  d.boundaries = p->boundaries;
  d.active_stages = input.active_stages;
  d.split = IdentitySplit(input.active_stages);
  d.predicted_bottleneck_s =
      core::Bottleneck(core::StageLoads(input.model, d.boundaries));
  if (d.boundaries == input.current) {
    d.predicted_bottleneck_s = d.current_bottleneck_s;
    return d;
  }
  absl::StatusOr<core::MigrationPlan> m = core::PlanMigrationBetween(
      input.model.layers, input.current, d.boundaries);
  if (!m.ok()) return m.status();
  for (core::LayerMigration lm : m->migrations) {
    lm.from_stage = OriginalId(input.active_stages, lm.from_stage);
    lm.to_stage = OriginalId(input.active_stages, lm.to_stage);
    d.migrations.push_back(lm);
  }
  d.migration_bytes = m->total_bytes;
  d.changes_layout = true;
  return d;
}

}  // namespace dynmo::service
