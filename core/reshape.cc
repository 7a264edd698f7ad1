#include "core/reshape.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/measures.h"
#include "core/partition.h"
#include "core/pipeline_sim.h"

namespace dynmo::core {
namespace {

bool FinitePositive(double v) { return std::isfinite(v) && v > 0; }

// The pipeline model of one replica of a pp x dp grid: every stage the
// spec's device at the speed of its slowest replica, holding the schedule's
// in-flight activations at its peak.
PipelineModel ReplicaModel(absl::Span<const LayerCost> layers,
                           const ShapeSpec& spec, int pp, int dp, int microbatches) {
  PipelineModel model;
  model.layers.assign(layers.begin(), layers.end());
  model.link = spec.link;
  model.stages.resize(pp, spec.device);
  for (int s = 0; s < pp; ++s) {
    model.stages[s].inflight_microbatches =
        std::min(microbatches, WarmupCount(spec.schedule, s, pp, microbatches) + 1);
    if (spec.rank_speeds.empty()) continue;
    double speed = spec.rank_speeds[static_cast<size_t>(s * dp)];
    for (int r = 1; r < dp; ++r) {
      speed = std::min(speed, spec.rank_speeds[static_cast<size_t>(s * dp + r)]);
    }
    model.stages[s].speed = speed;
  }
  return model;
}

// rank_speeds is empty or one finite positive speed per rank of `grid`.
absl::Status ValidateRankSpeeds(const ShapeSpec& spec, const Grid& grid) {
  if (spec.rank_speeds.empty()) return absl::OkStatus();
  if (spec.rank_speeds.size() != static_cast<size_t>(grid.pp) * static_cast<size_t>(grid.dp)) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.rank_speeds.size(), " rank speeds for a grid of ",
                     grid.pp * grid.dp, " ranks"));
  }
  for (double v : spec.rank_speeds) {
    if (!FinitePositive(v)) {
      return absl::InvalidArgumentError("rank speeds must be finite and > 0");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateGrid(const Grid& grid, int num_layers) {
  if (grid.pp < 1 || grid.dp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("grid ", grid.pp, "x", grid.dp, ": pp and dp must be >= 1"));
  }
  return ValidateBoundaries(grid.boundaries, num_layers, grid.pp);
}

// Prices `grid` (boundaries given) for `layers`; copy fields left 0.
absl::StatusOr<ShapeCost> Price(const PipelineModel& model, const ShapeSpec& spec,
                                const Grid& grid, int microbatches) {
  ShapeCost cost;
  cost.pp = grid.pp;
  cost.dp = grid.dp;
  cost.boundaries = grid.boundaries;
  SimConfig sim;
  sim.schedule = spec.schedule;
  sim.microbatches = microbatches;
  sim.stages = StagePassTimesFor(model, grid.boundaries);
  sim.transfer_s = model.link.exposed_transfer_s();
  absl::StatusOr<SimResult> run = SimulatePipeline(sim);
  if (!run.ok()) return run.status();
  cost.pipeline_s = run->iteration_time_s;
  const double bw = spec.data_parallel.allreduce_bandwidth_bytes_per_s;
  if (grid.dp > 1 && bw > 0) {
    const LayerPrefix prefix(model.layers);
    double slowest = 0;
    for (int s = 0; s < grid.pp; ++s) {
      const double bytes =
          static_cast<double>(prefix.params(grid.boundaries[s], grid.boundaries[s + 1])) *
          static_cast<double>(spec.data_parallel.grad_bytes_per_param);
      slowest = std::max(slowest, 2.0 * (grid.dp - 1) / grid.dp * bytes / bw);
    }
    cost.allreduce_s = (1 - spec.data_parallel.overlap) * slowest;
  }
  cost.iteration_s = cost.pipeline_s + cost.allreduce_s;
  cost.tokens_per_s =
      cost.iteration_s > 0
          ? spec.global_microbatches * spec.tokens_per_microbatch / cost.iteration_s
          : 0;
  return cost;
}

bool FitsEveryStage(const PipelineModel& model, const Boundaries& b) {
  const LayerPrefix prefix(model.layers);
  for (size_t s = 0; s + 1 < b.size(); ++s) {
    if (!FitsMemory(prefix, model.stages[s], b[s], b[s + 1])) return false;
  }
  return true;
}

absl::StatusOr<int> MicrobatchesPerReplica(const ShapeSpec& spec, int dp) {
  if (spec.global_microbatches % dp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.global_microbatches, " micro-batches per iteration do not split over ",
                     dp, " replicas"));
  }
  return spec.global_microbatches / dp;
}

}  // namespace

absl::Status ValidateShapeSpec(const ShapeSpec& spec) {
  const DataParallelSpec& d = spec.data_parallel;
  if (spec.global_microbatches < 1) {
    return absl::InvalidArgumentError("global micro-batches must be >= 1");
  }
  if (!FinitePositive(spec.tokens_per_microbatch)) {
    return absl::InvalidArgumentError("tokens per micro-batch must be finite and > 0");
  }
  if (!FinitePositive(spec.device.speed)) {
    return absl::InvalidArgumentError("device speed must be finite and > 0");
  }
  if (!FiniteNonNegative(d.allreduce_bandwidth_bytes_per_s) ||
      !FiniteNonNegative(d.copy_bandwidth_bytes_per_s) ||
      !FiniteNonNegative(spec.link.bandwidth_bytes_per_s)) {
    return absl::InvalidArgumentError("bandwidths must be finite and >= 0");
  }
  if (!(d.overlap >= 0 && d.overlap <= 1)) {
    return absl::InvalidArgumentError("all-reduce overlap must be in [0, 1]");
  }
  if (d.grad_bytes_per_param < 0 || spec.link.boundary_bytes < 0) {
    return absl::InvalidArgumentError("byte counts must be >= 0");
  }
  return absl::OkStatus();
}

std::vector<int64_t> ReshapeReceiveBytes(absl::Span<const LayerCost> layers,
                                         const Grid& from, const Grid& to) {
  const int ranks = from.pp * from.dp;
  std::vector<int64_t> bytes(ranks, 0);
  for (int p = 0; p < ranks; ++p) {
    const int old_stage = p / from.dp;
    const int new_stage = p / to.dp;
    const int old_lo = from.boundaries[old_stage], old_hi = from.boundaries[old_stage + 1];
    for (int l = to.boundaries[new_stage]; l < to.boundaries[new_stage + 1]; ++l) {
      if (l < old_lo || l >= old_hi) bytes[p] += layers[l].resident_bytes;
    }
  }
  return bytes;
}

absl::StatusOr<ShapeCost> CostOfGrid(absl::Span<const LayerCost> layers,
                                     const ShapeSpec& spec, const Grid& grid) {
  if (absl::Status s = ValidateShapeSpec(spec); !s.ok()) return s;
  const int n = static_cast<int>(layers.size());
  if (absl::Status s = ValidateGrid(grid, n); !s.ok()) return s;
  if (absl::Status s = ValidateRankSpeeds(spec, grid); !s.ok()) return s;
  absl::StatusOr<int> m = MicrobatchesPerReplica(spec, grid.dp);
  if (!m.ok()) return m.status();
  PipelineModel model = ReplicaModel(layers, spec, grid.pp, grid.dp, *m);
  if (absl::Status s = ValidateModel(model); !s.ok()) return s;
  return Price(model, spec, grid, *m);
}

absl::StatusOr<ShapeCost> CostOfShape(absl::Span<const LayerCost> layers,
                                      const ShapeSpec& spec, const Grid& from,
                                      int pp, int dp) {
  if (absl::Status s = ValidateShapeSpec(spec); !s.ok()) return s;
  const int n = static_cast<int>(layers.size());
  if (absl::Status s = ValidateGrid(from, n); !s.ok()) return s;
  if (absl::Status s = ValidateRankSpeeds(spec, from); !s.ok()) return s;
  if (pp < 1 || dp < 1 || pp * dp != from.pp * from.dp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grid ", pp, "x", dp, " does not use the ", from.pp * from.dp, " ranks of ",
        from.pp, "x", from.dp));
  }
  if (pp > n) {
    return absl::InvalidArgumentError(
        absl::StrCat(pp, " stages for ", n, " layers"));
  }
  absl::StatusOr<int> m = MicrobatchesPerReplica(spec, dp);
  if (!m.ok()) return m.status();
  PipelineModel model = ReplicaModel(layers, spec, pp, dp, *m);
  if (absl::Status s = ValidateModel(model); !s.ok()) return s;
  // On the same number of stages, ties go to the layout in force (the
  // optimum moves nothing it need not move).
  absl::StatusOr<Boundaries> b =
      PartitionOptimal(model, pp == from.pp ? &from.boundaries : nullptr);
  if (!b.ok()) return b.status();
  Grid to{pp, dp, *std::move(b)};
  absl::StatusOr<ShapeCost> cost = Price(model, spec, to, *m);
  if (!cost.ok()) return cost.status();
  // The least bottleneck is not always the fastest iteration (the schedule's
  // fill and drain see every stage): on the same stages, keep the layout in
  // force when the simulator says it is at least as fast.
  if (pp == from.pp && to.boundaries != from.boundaries &&
      FitsEveryStage(model, from.boundaries)) {
    absl::StatusOr<ShapeCost> kept = Price(model, spec, Grid{pp, dp, from.boundaries}, *m);
    if (!kept.ok()) return kept.status();
    if (kept->iteration_s <= cost->iteration_s) {
      to.boundaries = from.boundaries;
      cost = std::move(kept);
    }
  }
  const std::vector<int64_t> received = ReshapeReceiveBytes(layers, from, to);
  int64_t busiest = 0;
  for (int64_t r : received) {
    cost->copy_bytes += r;
    busiest = std::max(busiest, r);
  }
  const double bw = spec.data_parallel.copy_bandwidth_bytes_per_s;
  cost->copy_s = bw > 0 ? static_cast<double>(busiest) / bw : 0;
  return cost;
}

absl::StatusOr<std::vector<ShapeCost>> FeasibleShapes(
    absl::Span<const LayerCost> layers, const ShapeSpec& spec, const Grid& from) {
  if (absl::Status s = ValidateShapeSpec(spec); !s.ok()) return s;
  if (absl::Status s = ValidateGrid(from, static_cast<int>(layers.size())); !s.ok()) {
    return s;
  }
  const int ranks = from.pp * from.dp;
  std::vector<ShapeCost> out;
  std::string last_refusal;
  for (int pp = 1; pp <= ranks; ++pp) {
    if (ranks % pp != 0) continue;
    absl::StatusOr<ShapeCost> cost = CostOfShape(layers, spec, from, pp, ranks / pp);
    if (cost.ok()) {
      out.push_back(*std::move(cost));
    } else {
      last_refusal = std::string(cost.status().message());
    }
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no grid of ", ranks, " ranks is feasible: ", last_refusal));
  }
  std::stable_sort(out.begin(), out.end(), [](const ShapeCost& a, const ShapeCost& b) {
    if (a.tokens_per_s != b.tokens_per_s) return a.tokens_per_s > b.tokens_per_s;
    if (a.copy_bytes != b.copy_bytes) return a.copy_bytes < b.copy_bytes;
    return a.pp > b.pp;
  });
  return out;
}

}  // namespace dynmo::core
