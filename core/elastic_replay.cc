#include "core/elastic_replay.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/measures.h"
#include "core/migration.h"
#include "core/partition.h"
#include "core/repack.h"
#include "core/replay.h"

namespace dynmo::core {
namespace {

std::vector<LayerCost> CostsOf(const TraceRecord& record, int64_t bytes_per_param) {
  std::vector<LayerCost> costs = LayerCostsOf(record);
  if (bytes_per_param > 0) {
    for (LayerCost& l : costs) l.params = l.resident_bytes / bytes_per_param;
  }
  return costs;
}

std::string GridName(const Grid& g) { return absl::StrCat(g.pp, "x", g.dp); }

absl::Status AtIter(int64_t iter, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("iter ", iter, ": ", status.message()));
}

// A layout change a mode decided on, and the pause it costs.
struct Change {
  Grid grid;
  double pause_s = 0;
  std::string what;
};

// What a mode does when the trigger fires: the change to make, if any.
using Decide = std::function<absl::StatusOr<std::optional<Change>>(
    const std::vector<LayerCost>& smoothed, const Grid& now)>;

// Seconds `bytes` take at `bandwidth` (0 = free).
double PauseS(int64_t bytes, double bandwidth) {
  return bandwidth > 0 ? static_cast<double>(bytes) / bandwidth : 0;
}

// Re-balancing on the grid's own stages, if it promises min_gain.
absl::StatusOr<std::optional<Change>> Repartition(const ElasticReplayConfig& config,
                                                  const std::vector<LayerCost>& smoothed,
                                                  const Grid& now) {
  absl::StatusOr<ShapeCost> cur = CostOfGrid(smoothed, config.spec, now);
  if (!cur.ok()) return cur.status();
  absl::StatusOr<ShapeCost> next = CostOfShape(smoothed, config.spec, now, now.pp, now.dp);
  if (!next.ok()) return next.status();
  if (next->boundaries == now.boundaries ||
      !(next->iteration_s < cur->iteration_s * (1 - config.min_gain))) {
    return std::nullopt;
  }
  absl::StatusOr<MigrationPlan> moves =
      PlanMigrationBetween(smoothed, now.boundaries, next->boundaries);
  if (!moves.ok()) return moves.status();
  Change change{Grid{now.pp, now.dp, next->boundaries},
                PauseS(moves->total_bytes, config.migration_bandwidth_bytes_per_s),
                "re-partition"};
  // The move must repay its pause within the payback horizon.
  if ((cur->iteration_s - next->iteration_s) * config.payback_iterations < change.pause_s) {
    return std::nullopt;
  }
  return change;
}

absl::StatusOr<std::optional<Change>> Release(const ElasticReplayConfig& config,
                                              const std::vector<LayerCost>& smoothed,
                                              const Grid& now) {
  PipelineModel full;
  full.layers = smoothed;
  full.link = config.spec.link;
  StageSpec device = config.spec.device;
  device.inflight_microbatches = 0;
  full.stages.assign(config.pp, device);
  // Release trades what re-balancing gained for GPUs: the packed pipeline
  // must keep the static layout's speed (its bottleneck on these costs).
  const Grid fixed{config.pp, now.dp,
                   PartitionUniform(static_cast<int>(smoothed.size()), config.pp)};
  const double reference = Bottleneck(StageLoads(full, fixed.boundaries));
  PipelineModel active = full;
  active.stages.assign(now.pp, device);
  RepackOptions options;
  options.tolerance = config.repack_tolerance;
  options.reference_bottleneck = reference;
  options.current = now.boundaries;
  absl::StatusOr<RepackResult> packed = RepackOptimal(active, options);
  if (packed.ok() && static_cast<int>(packed->active_stages.size()) < now.pp) {
    const int k = static_cast<int>(packed->active_stages.size());
    // The bottleneck is the stage model's view; the simulated iteration (the
    // schedule's fill and drain included) must agree before GPUs go.
    absl::StatusOr<ShapeCost> fixed_cost = CostOfGrid(smoothed, config.spec, fixed);
    if (!fixed_cost.ok()) return fixed_cost.status();
    absl::StatusOr<ShapeCost> packed_cost =
        CostOfGrid(smoothed, config.spec, Grid{k, now.dp, packed->boundaries});
    if (!packed_cost.ok()) return packed_cost.status();
    if (packed_cost->iteration_s > fixed_cost->iteration_s * (1 + config.repack_tolerance)) {
      return Repartition(config, smoothed, now);
    }
    return Change{Grid{k, now.dp, packed->boundaries},
                  PauseS(packed->migration.total_bytes, config.migration_bandwidth_bytes_per_s),
                  absl::StrCat("release ", now.pp - k, " stages: ", GridName(now), " -> ",
                               k, "x", now.dp)};
  }
  return Repartition(config, smoothed, now);
}

absl::StatusOr<std::optional<Change>> Reshape(const ElasticReplayConfig& config,
                                              const std::vector<LayerCost>& smoothed,
                                              const Grid& now) {
  absl::StatusOr<std::vector<ShapeCost>> shapes = FeasibleShapes(smoothed, config.spec, now);
  if (!shapes.ok()) return shapes.status();
  const ShapeCost& best = shapes->front();
  if (best.pp == now.pp) return Repartition(config, smoothed, now);
  absl::StatusOr<ShapeCost> cur = CostOfGrid(smoothed, config.spec, now);
  if (!cur.ok()) return cur.status();
  const double saved = cur->iteration_s - best.iteration_s;
  if (!(best.iteration_s < cur->iteration_s * (1 - config.min_gain)) ||
      saved * config.payback_iterations < best.copy_s) {
    return Repartition(config, smoothed, now);
  }
  const Grid next{best.pp, best.dp, best.boundaries};
  return Change{next, best.copy_s, absl::StrCat(GridName(now), " -> ", GridName(next))};
}

absl::StatusOr<ModeResult> Run(const Trace& trace, const ElasticReplayConfig& config,
                               ElasticMode mode, const Decide& decide) {
  const int n = static_cast<int>(trace.front().layers.size());
  ModeResult result;
  result.mode = mode;
  Grid grid{config.pp, config.dp, PartitionUniform(n, config.pp)};
  const int window =
      config.smoothing_window > 0
          ? config.smoothing_window
          : (config.trigger.kind == RebalanceTrigger::Kind::kEvery ? config.trigger.every : 1);
  std::deque<std::vector<LayerCost>> recent;
  std::vector<LayerCost> reference = CostsOf(trace.front(), config.resident_bytes_per_param);
  int since_decision = 0;
  const size_t tail_from = trace.size() - std::max<size_t>(1, trace.size() / 10);
  double tail_s = 0;
  const double tokens = config.spec.global_microbatches * config.spec.tokens_per_microbatch;

  for (size_t k = 0; k < trace.size(); ++k) {
    const int64_t iter = trace[k].iter;
    std::vector<LayerCost> costs = CostsOf(trace[k], config.resident_bytes_per_param);
    Grid in_force = grid;
    if (mode == ElasticMode::kOracle) {
      absl::StatusOr<ShapeCost> best = CostOfShape(costs, config.spec, grid, grid.pp, grid.dp);
      if (!best.ok()) return AtIter(iter, best.status());
      in_force.boundaries = best->boundaries;
    }
    absl::StatusOr<ShapeCost> cost = CostOfGrid(costs, config.spec, in_force);
    if (!cost.ok()) return AtIter(iter, cost.status());
    result.total_s += cost->iteration_s;
    result.gpu_seconds += cost->iteration_s * grid.pp * grid.dp;
    if (k >= tail_from) tail_s += cost->iteration_s;

    recent.push_back(costs);
    while (static_cast<int>(recent.size()) > window) recent.pop_front();
    if (!decide || k + 1 == trace.size()) continue;
    ++since_decision;
    const double change = RelativeTimeChange(reference, costs);
    if (!TriggerFires(config.trigger, {since_decision, change, false})) continue;
    since_decision = 0;
    reference = costs;
    const std::vector<LayerCost> smoothed = SmoothedCosts(recent, config.step_threshold);
    absl::StatusOr<std::optional<Change>> next = decide(smoothed, grid);
    if (!next.ok()) return AtIter(iter, next.status());
    if (!next->has_value()) continue;
    Change& c = **next;
    result.migration_s += c.pause_s;
    result.total_s += c.pause_s;
    result.gpu_seconds += c.pause_s * grid.pp * grid.dp;
    ++result.changes;
    if (c.what != "re-partition") result.events.push_back({iter, c.what});
    grid = std::move(c.grid);
  }
  const double iterations = static_cast<double>(trace.size());
  result.tokens_per_s = result.total_s > 0 ? iterations * tokens / result.total_s : 0;
  result.mean_gpus = result.total_s > 0 ? result.gpu_seconds / result.total_s : 0;
  result.final_tokens_per_s =
      tail_s > 0 ? static_cast<double>(trace.size() - tail_from) * tokens / tail_s : 0;
  result.final_grid = grid;
  return result;
}

}  // namespace

std::string ElasticModeName(ElasticMode mode) {
  switch (mode) {
    case ElasticMode::kStatic: return "static";
    case ElasticMode::kRepartition: return "repartition";
    case ElasticMode::kRelease: return "release";
    case ElasticMode::kReshape: return "reshape";
    case ElasticMode::kOracle: return "oracle";
  }
  return "?";
}

absl::Status ValidateElasticReplayConfig(const ElasticReplayConfig& config) {
  if (config.pp < 1 || config.dp < 1) {
    return absl::InvalidArgumentError("pp and dp must be >= 1");
  }
  if (absl::Status s = ValidateShapeSpec(config.spec); !s.ok()) return s;
  if (absl::Status s = ValidateReplayTrigger(config.trigger); !s.ok()) return s;
  if (config.smoothing_window < 0) {
    return absl::InvalidArgumentError("smoothing window must be >= 0");
  }
  if (!(config.min_gain >= 0 && config.min_gain < 1)) {
    return absl::InvalidArgumentError("min_gain must be in [0, 1)");
  }
  if (!FiniteNonNegative(config.repack_tolerance) ||
      !FiniteNonNegative(config.migration_bandwidth_bytes_per_s)) {
    return absl::InvalidArgumentError(
        "repack tolerance and migration bandwidth must be finite and >= 0");
  }
  if (!FiniteNonNegative(config.step_threshold)) {
    return absl::InvalidArgumentError("step threshold must be finite and >= 0");
  }
  if (config.payback_iterations < 1 || config.resident_bytes_per_param < 0) {
    return absl::InvalidArgumentError(
        "payback iterations must be >= 1 and bytes per parameter >= 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ModeResult>> ReplayElastic(const Trace& trace,
                                                      const ElasticReplayConfig& config) {
  if (absl::Status s = ValidateTrace(trace); !s.ok()) return s;
  if (absl::Status s = ValidateElasticReplayConfig(config); !s.ok()) return s;
  const int n = static_cast<int>(trace.front().layers.size());
  if (config.pp > n) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.pp, " stages cannot each hold a layer of ", n));
  }
  const Decide decides[] = {
      nullptr,
      [&](const std::vector<LayerCost>& s, const Grid& g) { return Repartition(config, s, g); },
      [&](const std::vector<LayerCost>& s, const Grid& g) { return Release(config, s, g); },
      [&](const std::vector<LayerCost>& s, const Grid& g) { return Reshape(config, s, g); },
      nullptr,
  };
  std::vector<ModeResult> out;
  for (int m = 0; m < 5; ++m) {
    absl::StatusOr<ModeResult> r =
        Run(trace, config, static_cast<ElasticMode>(m), decides[m]);
    if (!r.ok()) return r.status();
    out.push_back(*std::move(r));
  }
  return out;
}

}  // namespace dynmo::core
