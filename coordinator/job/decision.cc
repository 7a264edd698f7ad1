#include "coordinator/job/decision.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/measures.h"
#include "core/partition.h"

namespace dynmo::service {
namespace {

// A re-shape must promise this much over the best alternative.
constexpr double kReshapeMinGain = 1.01;

std::vector<core::CommSplit> IdentitySplit(const std::vector<int>& active) {
  std::vector<core::CommSplit> split;
  for (size_t i = 0; i < active.size(); ++i) {
    split.push_back({active[i], 0, static_cast<int>(i)});
  }
  return split;
}

// The device every rank of a re-shaped grid is priced as: the smallest
// capacity (unbounded only when every stage is); speeds are per rank
// (RankSpeeds).
core::StageSpec CommonDevice(const std::vector<core::StageSpec>& stages) {
  core::StageSpec d = stages.front();
  d.speed = 1.0;
  for (const core::StageSpec& s : stages) {
    if (s.capacity_bytes >= 0 &&
        (d.capacity_bytes < 0 || s.capacity_bytes < d.capacity_bytes)) {
      d.capacity_bytes = s.capacity_bytes;
    }
  }
  return d;
}

// The speeds of the ranks of model stages `stages` (in order), by position
// (stage index in `stages` * dp + replica).
std::vector<double> RankSpeeds(const DecisionInput& in, const std::vector<int>& stages) {
  const int dp = std::max(1, in.data_parallel);
  const bool measured =
      in.rank_speeds.size() == in.model.stages.size() * static_cast<size_t>(dp);
  std::vector<double> speeds;
  for (int s : stages) {
    for (int r = 0; r < dp; ++r) {
      speeds.push_back(measured ? in.rank_speeds[static_cast<size_t>(s * dp + r)]
                                : in.model.stages[static_cast<size_t>(s)].speed);
    }
  }
  return speeds;
}

std::vector<int> AllStages(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

// The re-shape decision (see Decide), or none.
absl::StatusOr<std::optional<Decision>> DecideReshape(const DecisionInput& in) {
  const int num_stages = static_cast<int>(in.model.stages.size());
  // Only a job running every stage it started with is re-shaped: its ranks
  // are then positions 0..pp*dp-1 of plan.proto's Reshape rule.
  if (in.full_stages > num_stages) return std::optional<Decision>();
  core::ShapeSpec spec;
  spec.global_microbatches = in.microbatches * in.data_parallel;
  spec.schedule = in.schedule;
  spec.device = CommonDevice(in.model.stages);
  spec.rank_speeds = RankSpeeds(in, AllStages(num_stages));
  spec.link = in.model.link;
  spec.data_parallel = in.data_parallel_spec;
  const core::Grid from{num_stages, in.data_parallel, in.current};
  absl::StatusOr<std::vector<core::ShapeCost>> shapes =
      core::FeasibleShapes(in.model.layers, spec, from);
  if (!shapes.ok()) return std::optional<Decision>();  // keep the shape
  const core::ShapeCost& best = shapes->front();
  if (best.pp == num_stages) return std::optional<Decision>();
  absl::StatusOr<core::ShapeCost> now = core::CostOfGrid(in.model.layers, spec, from);
  if (!now.ok()) return now.status();
  // Re-balancing in place is one of the grids FeasibleShapes priced; one
  // missing from the list is priced again for its reason.
  auto in_place = std::find_if(shapes->begin(), shapes->end(), [&](const core::ShapeCost& c) {
    return c.pp == num_stages;
  });
  if (in_place == shapes->end()) {
    return core::CostOfShape(in.model.layers, spec, from, num_stages, in.data_parallel)
        .status();
  }
  wire::Reshape choice;
  choice.pipeline_size = best.pp;
  choice.data_parallel_size = best.dp;
  choice.copy_bytes = best.copy_bytes;
  choice.predicted_microbatches_per_s = best.tokens_per_s;  // one "token" per micro-batch
  choice.previous_microbatches_per_s = in_place->tokens_per_s;
  core::RepackOptions ro;
  ro.tolerance = in.policy.repack_tolerance;
  ro.current = in.current;
  absl::StatusOr<core::RepackResult> packed = core::RepackOptimal(in.model, ro);
  if (packed.ok() && !packed->released_stages.empty()) {
    core::ShapeSpec packed_spec = spec;
    packed_spec.rank_speeds = RankSpeeds(in, packed->active_stages);
    absl::StatusOr<core::ShapeCost> release = core::CostOfGrid(
        in.model.layers, packed_spec,
        core::Grid{static_cast<int>(packed->active_stages.size()), in.data_parallel,
                   packed->boundaries});
    if (release.ok()) choice.release_microbatches_per_s = release->tokens_per_s;
  }
  const double rival =
      std::max(choice.previous_microbatches_per_s, choice.release_microbatches_per_s);
  if (!(choice.predicted_microbatches_per_s > rival * kReshapeMinGain)) {
    return std::optional<Decision>();
  }
  Decision d;
  d.changes_layout = true;
  d.boundaries = best.boundaries;
  for (int s = 0; s < best.pp; ++s) d.active_stages.push_back(s);
  d.migration_bytes = best.copy_bytes;
  const double unexplained = std::max(0.0, in.measured_iteration_s - now->iteration_s);
  d.previous_bottleneck_s = (now->iteration_s + unexplained) / in.microbatches;
  d.predicted_bottleneck_s = (best.iteration_s + unexplained) / in.microbatches;
  d.reshape = choice;
  return std::optional<Decision>(std::move(d));
}

// Prices layouts as the job's step time per micro-batch (Decision's
// previous_bottleneck_s / predicted_bottleneck_s).
class StepPricer {
 public:
  // Prices the current layout; errors come from the simulator.
  static absl::StatusOr<StepPricer> ForCurrent(const DecisionInput& in) {
    StepPricer p;
    p.schedule_ = in.schedule;
    p.microbatches_ = std::max(1, in.microbatches);
    absl::StatusOr<double> now =
        core::PredictedIterationTime(in.model, in.current, p.schedule_, p.microbatches_);
    if (!now.ok()) return now.status();
    p.unexplained_s_ = std::max(0.0, in.measured_iteration_s - *now);
    p.now_s_ = (*now + p.unexplained_s_) / p.microbatches_;
    return p;
  }
  double now_s() const { return now_s_; }
  // `model` on boundaries `b` (its stages the ones that would run).
  absl::StatusOr<double> Price(const core::PipelineModel& model,
                               const core::Boundaries& b) const {
    absl::StatusOr<double> t = core::PredictedIterationTime(model, b, schedule_, microbatches_);
    if (!t.ok()) return t.status();
    return (*t + unexplained_s_) / microbatches_;
  }

 private:
  core::Schedule schedule_ = core::Schedule::k1F1B;
  int microbatches_ = 1;
  double unexplained_s_ = 0;
  double now_s_ = 0;
};

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
  absl::StatusOr<StepPricer> pricer = StepPricer::ForCurrent(input);
  if (!pricer.ok()) return pricer.status();
  d.previous_stage_s = core::Bottleneck(core::StageLoads(input.model, input.current));
  d.previous_bottleneck_s = pricer->now_s();

  if (input.policy.repack && input.policy.elastic == Elastic::kReshape) {
    absl::StatusOr<std::optional<Decision>> r = DecideReshape(input);
    if (!r.ok()) return r.status();
    if (r->has_value()) return **std::move(r);
    // No re-shape pays: re-balance in place and release nothing.
  } else if (input.policy.repack && num_stages > 1) {
    core::RepackOptions ro;
    ro.tolerance = input.policy.repack_tolerance;
    ro.current = input.current;
    // The survivors, the split and the moves come back in the job's own
    // stage ids, as the plan carries them.
    ro.stage_ids = input.active_stages;
    if (input.full_stages > num_stages) {
      // The released stages are priced like the fastest active one: the
      // reference is the job on all its stages at full speed.
      core::PipelineModel full = input.model;
      core::StageSpec fastest = input.model.stages[0];
      for (const core::StageSpec& s : input.model.stages) {
        fastest.speed = std::max(fastest.speed, s.speed);
      }
      full.stages.assign(static_cast<size_t>(input.full_stages), fastest);
      absl::StatusOr<double> best = core::OptimalBottleneck(full);
      if (best.ok() && *best > 0) ro.reference_bottleneck = *best;
    }
    absl::StatusOr<core::RepackResult> r = core::RepackOptimal(input.model, ro);
    if (!r.ok()) return r.status();
    if (!r->released_stages.empty()) {
      d.changes_layout = true;
      d.boundaries = r->boundaries;
      d.active_stages = r->active_stages;
      d.released_stages = r->released_stages;
      d.migrations = r->migration.migrations;
      d.split = r->split;
      d.migration_bytes = r->migration.total_bytes;
      d.predicted_stage_s = r->bottleneck;
      // The survivors' model: each at its own speed and exchanges.
      core::PipelineModel packed = input.model;
      packed.stages.clear();
      for (int id : r->active_stages) {
        const auto at = std::find(input.active_stages.begin(), input.active_stages.end(), id);
        if (at == input.active_stages.end()) {
          return absl::InternalError(absl::StrCat("decision: re-pack kept stage ", id,
                                                  ", not an active one"));
        }
        packed.stages.push_back(
            input.model.stages[static_cast<size_t>(at - input.active_stages.begin())]);
      }
      absl::StatusOr<double> price = pricer->Price(packed, r->boundaries);
      if (!price.ok()) return price.status();
      d.predicted_bottleneck_s = *price;
      return d;
    }
  }

  core::PartitionOptions po;
  po.method = input.policy.balancer;
  po.current = input.current;
  po.near_tie = input.near_tie;
  absl::StatusOr<core::PartitionResult> p = core::Partition(input.model, po);
  if (!p.ok()) return p.status();
  d.boundaries = p->boundaries;
  d.active_stages = input.active_stages;
  d.split = IdentitySplit(input.active_stages);
  if (d.boundaries == input.current) {
    d.predicted_stage_s = d.previous_stage_s;
    d.predicted_bottleneck_s = d.previous_bottleneck_s;
    return d;
  }
  d.predicted_stage_s = core::Bottleneck(core::StageLoads(input.model, d.boundaries));
  absl::StatusOr<double> price = pricer->Price(input.model, d.boundaries);
  if (!price.ok()) return price.status();
  d.predicted_bottleneck_s = *price;
  // The moves name the job's original stage ids from the start (each
  // layer's owner under either layout), as the plan carries them.
  absl::StatusOr<core::MigrationPlan> m = core::PlanMigration(
      input.model.layers, core::LayerOwners(input.current, input.active_stages),
      core::LayerOwners(d.boundaries, input.active_stages));
  if (!m.ok()) return m.status();
  d.migrations = std::move(m->migrations);
  d.migration_bytes = m->total_bytes;
  d.changes_layout = true;
  return d;
}

}  // namespace dynmo::service
