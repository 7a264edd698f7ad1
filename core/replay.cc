#include "core/replay.h"

#include <cmath>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/smoothed_costs.h"
#include "core/measures.h"
#include "core/migration.h"

namespace dynmo::core {
namespace {

PipelineModel ModelOf(const TraceRecord& record, const ReplayConfig& config) {
  PipelineModel model;
  model.layers = LayerCostsOf(record);
  StageSpec stage;
  stage.capacity_bytes = config.stage_capacity_bytes;
  model.stages.assign(config.stages, stage);
  return model;
}

// What one record costs under one partition.
struct IterationCost {
  double time_s = 0;
  double bubble_ratio = 0;
  double imbalance = 0;
  bool fits_memory = true;
};

absl::StatusOr<IterationCost> CostOf(const PipelineModel& model,
                                     const Boundaries& b,
                                     const ReplayConfig& config) {
  SimConfig sim;
  sim.schedule = config.schedule;
  sim.microbatches = config.microbatches;
  sim.stages = StagePassTimesFor(model, b);
  sim.transfer_s = model.link.exposed_transfer_s();
  absl::StatusOr<SimResult> run = SimulatePipeline(sim);
  if (!run.ok()) return run.status();
  IterationCost cost;
  cost.time_s = run->iteration_time_s;
  cost.bubble_ratio = run->bubble_ratio;
  cost.imbalance = Imbalance(StageLoads(model, b));
  const LayerPrefix prefix(model.layers);
  for (int s = 0; s < config.stages; ++s) {
    if (!FitsMemory(prefix, model.stages[s], b[s], b[s + 1])) {
      cost.fits_memory = false;
    }
  }
  return cost;
}

absl::Status AtIter(int64_t iter, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat("iter ", iter, ": ", status.message()));
}

}  // namespace

absl::Status ValidateReplayConfig(const ReplayConfig& config) {
  if (config.stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("stages must be >= 1, got ", config.stages));
  }
  if (config.microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("microbatches must be >= 1, got ", config.microbatches));
  }
  if (!std::isfinite(config.migration_bandwidth_bytes_per_s) ||
      config.migration_bandwidth_bytes_per_s < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "migration bandwidth must be finite and >= 0 (0 = free), got ",
        config.migration_bandwidth_bytes_per_s));
  }
  if (!(config.min_gain >= 0 && config.min_gain < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_gain must be in [0, 1), got ", config.min_gain));
  }
  return ValidateReplayTrigger(config.trigger);
}

absl::Status ValidateReplayTrigger(const RebalanceTrigger& trigger) {
  if (trigger.kind != RebalanceTrigger::Kind::kEvery &&
      trigger.kind != RebalanceTrigger::Kind::kOnChange) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trigger '", TriggerName(trigger),
        "' cannot be replayed: a trace replays every:N or on-change[:T]"));
  }
  return ValidateTrigger(trigger);
}

absl::StatusOr<ReplayResult> ReplayTrace(const Trace& trace,
                                         const ReplayConfig& config) {
  if (absl::Status s = ValidateTrace(trace); !s.ok()) return s;
  if (absl::Status s = ValidateReplayConfig(config); !s.ok()) return s;
  const int num_layers = static_cast<int>(trace.front().layers.size());
  if (config.stages > num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.stages, " stages cannot each hold a layer of a ",
                     num_layers, "-layer trace"));
  }

  ReplayResult result;
  result.iterations = static_cast<int>(trace.size());
  result.static_boundaries = PartitionUniform(num_layers, config.stages);
  Boundaries current = result.static_boundaries;
  // What the last decision saw; the uniform start stands for a decision made
  // on the first profile, so an unchanging model never triggers on-change.
  std::vector<LayerCost> reference = LayerCostsOf(trace.front());
  int since_decision = 0;
  std::deque<std::vector<LayerCost>> recent;  // records since the last decision

  for (size_t k = 0; k < trace.size(); ++k) {
    const int64_t iter = trace[k].iter;
    const PipelineModel model = ModelOf(trace[k], config);

    absl::StatusOr<IterationCost> fixed =
        CostOf(model, result.static_boundaries, config);
    if (!fixed.ok()) return AtIter(iter, fixed.status());
    absl::StatusOr<IterationCost> moving = CostOf(model, current, config);
    if (!moving.ok()) return AtIter(iter, moving.status());

    result.static_total_s += fixed->time_s;
    result.dynamic_total_s += moving->time_s;
    result.mean_imbalance_static += fixed->imbalance;
    result.mean_imbalance_dynamic += moving->imbalance;
    result.mean_bubble_static += fixed->bubble_ratio;
    result.mean_bubble_dynamic += moving->bubble_ratio;
    result.static_fits_memory &= fixed->fits_memory;
    result.dynamic_fits_memory &= moving->fits_memory;

    recent.push_back(model.layers);
    // A decision after the last record would never be used.
    if (k + 1 == trace.size()) break;
    ++since_decision;
    const double change = RelativeTimeChange(reference, model.layers);
    if (!TriggerFires(config.trigger, {since_decision, change, false})) continue;

    ++result.decisions;
    since_decision = 0;
    reference = model.layers;
    // Decide on the records since the last decision, smoothed and cut at the
    // newest step (smoothed_costs.h), never on one record's jitter.
    PipelineModel smoothed = model;
    smoothed.layers = SmoothedCosts(recent, kDefaultChangeThreshold);
    recent.clear();
    PartitionOptions options;
    options.method = config.balancer;
    options.current = current;
    absl::StatusOr<PartitionResult> next = Partition(smoothed, options);
    if (!next.ok()) return AtIter(iter, next.status());
    if (next->boundaries == current) continue;
    absl::StatusOr<IterationCost> promised =
        CostOf(smoothed, next->boundaries, config);
    if (!promised.ok()) return AtIter(iter, promised.status());
    // A partition over a memory cap cannot run at all, so leaving it is
    // worth any price; otherwise the move must promise min_gain.
    absl::StatusOr<IterationCost> in_force = CostOf(smoothed, current, config);
    if (!in_force.ok()) return AtIter(iter, in_force.status());
    const bool worth_it =
        !moving->fits_memory ||
        promised->time_s < in_force->time_s * (1 - config.min_gain);
    if (!worth_it) continue;

    absl::StatusOr<MigrationPlan> plan =
        PlanMigrationBetween(model.layers, current, next->boundaries);
    if (!plan.ok()) return AtIter(iter, plan.status());
    ++result.rebalances;
    result.rebalance_iters.push_back(iter);
    result.moved_bytes += plan->total_bytes;
    if (config.migration_bandwidth_bytes_per_s > 0) {
      result.migration_s += static_cast<double>(plan->total_bytes) /
                            config.migration_bandwidth_bytes_per_s;
    }
    current = std::move(next->boundaries);
  }

  const double n = static_cast<double>(trace.size());
  result.mean_imbalance_static /= n;
  result.mean_imbalance_dynamic /= n;
  result.mean_bubble_static /= n;
  result.mean_bubble_dynamic /= n;
  result.dynamic_total_s += result.migration_s;
  result.speedup = result.dynamic_total_s > 0
                       ? result.static_total_s / result.dynamic_total_s
                       : 1.0;
  result.final_boundaries = current;
  return result;
}

}  // namespace dynmo::core
