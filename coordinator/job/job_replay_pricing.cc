// How the replay prices a record: the ranks' true speeds, an iteration on a
// grid, the oracle and the elastic bounds (job_replay_run.h).
#include <algorithm>
#include <utility>
#include <vector>

#include "core/partition.h"
#include "core/pipeline_sim.h"
#include "core/stage_program.h"
#include "coordinator/job/job_replay_run.h"
#include "coordinator/job/replay_bounds.h"

namespace dynmo::service::replay_internal {

double Replay::TrueSpeed(int rank, int64_t iter) const {
  double speed = 1;
  for (const SpeedChange& c : config_.stragglers) {
    if (c.rank == rank && iter >= c.from_iteration &&
        (c.to_iteration < 0 || iter < c.to_iteration)) {
      speed = std::min(speed, c.speed);
    }
  }
  return speed;
}

std::vector<std::vector<int>> Replay::RanksByStage() const {
  std::vector<std::vector<int>> out(grid_.active_stages.size());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_[r].released) continue;
    const auto at = std::find(grid_.active_stages.begin(), grid_.active_stages.end(),
                              ranks_[r].pipeline_rank);
    if (at != grid_.active_stages.end()) {
      out[static_cast<size_t>(at - grid_.active_stages.begin())].push_back(static_cast<int>(r));
    }
  }
  return out;
}

std::vector<std::vector<int>> Replay::StaticRanksByStage() const {
  std::vector<std::vector<int>> out(static_cast<size_t>(config_.pp));
  for (int r = 0; r < config_.pp * config_.dp; ++r) {
    out[static_cast<size_t>(r / config_.dp)].push_back(r);
  }
  return out;
}

core::PipelineModel Replay::SpeedModel(const std::vector<core::LayerCost>& layers,
                                      const std::vector<std::vector<int>>& stage_ranks,
                                      int64_t iter) const {
  core::PipelineModel model;
  model.layers = layers;
  for (const std::vector<int>& ranks : stage_ranks) {
    core::StageSpec st;
    for (int r : ranks) st.speed = std::min(st.speed, TrueSpeed(r, iter));
    model.stages.push_back(st);
  }
  return model;
}

absl::StatusOr<core::SimResult> Replay::Simulate(const core::PipelineModel& model,
                                                 const Grid& grid) const {
  core::SimConfig sim;
  sim.schedule = spec_.schedule;
  sim.microbatches = std::max(1, spec_.global_microbatches / grid.dp);
  sim.stages = core::StagePassTimesFor(model, grid.boundaries);
  return core::SimulatePipeline(sim);
}

absl::StatusOr<double> Replay::Cost(const std::vector<core::LayerCost>& layers,
                                    const Grid& grid,
                                    const std::vector<std::vector<int>>& stage_ranks,
                                    int64_t iter) const {
  absl::StatusOr<core::ShapeCost> c = core::CostOfGrid(
      layers, spec_,
      core::Grid{static_cast<int>(grid.active_stages.size()), grid.dp, grid.boundaries});
  if (!c.ok()) return c.status();
  if (config_.stragglers.empty()) return c->iteration_s;
  // Each stage at its slowest replica's speed; the all-reduce as priced.
  absl::StatusOr<core::SimResult> run =
      Simulate(SpeedModel(layers, stage_ranks, iter), grid);
  if (!run.ok()) return run.status();
  return run->iteration_time_s + c->allreduce_s;
}

absl::StatusOr<std::pair<double, core::Boundaries>> Replay::OracleCost(
    const std::vector<core::LayerCost>& layers,
    const std::vector<std::vector<int>>& static_ranks, int64_t iter) const {
  const core::PipelineModel model = SpeedModel(layers, static_ranks, iter);
  core::PartitionOptions po;
  po.method = core::PartitionMethod::kOptimal;
  absl::StatusOr<core::PartitionResult> best = core::Partition(model, po);
  if (!best.ok()) return best.status();
  Grid g;
  g.boundaries = best->boundaries;
  for (int s = 0; s < config_.pp; ++s) g.active_stages.push_back(s);
  g.dp = config_.dp;
  absl::StatusOr<double> cost = Cost(layers, g, static_ranks, iter);
  if (!cost.ok()) return cost.status();
  return std::make_pair(*cost, std::move(g.boundaries));
}

absl::Status Replay::ElasticBounds(std::vector<std::vector<core::LayerCost>> records) {
  const Policy& policy = config_.options.default_policy;
  if (!policy.repack) return absl::OkStatus();
  ElasticBoundsInput in;
  in.records = std::move(records);
  in.static_iteration_s = result_.static_iteration_s;
  if (!config_.stragglers.empty()) {
    for (int64_t iter : result_.record_iterations) {
      std::vector<double> speeds;
      for (int r = 0; r < config_.pp * config_.dp; ++r) speeds.push_back(TrueSpeed(r, iter));
      in.rank_speeds.push_back(std::move(speeds));
    }
  }
  in.spec = spec_;
  in.spec.device.capacity_bytes = config_.stage_capacity_bytes;
  in.pp = config_.pp;
  in.dp = config_.dp;
  if (policy.elastic == Elastic::kRelease) {
    absl::StatusOr<ReleaseBound> b = ReleaseGpuSecondsBound(in);
    if (!b.ok()) return b.status();
    result_.release_bound = *b;
  } else {
    absl::StatusOr<ReshapeBound> b = ReshapeSpeedBound(in);
    if (!b.ok()) return b.status();
    result_.reshape_bound = *b;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<double, double>> Replay::Shape(
    const std::vector<core::LayerCost>& layers, const Grid& grid) const {
  core::PipelineModel model;
  model.layers = layers;
  model.stages.assign(grid.active_stages.size(), core::StageSpec{});
  absl::StatusOr<core::SimResult> run = Simulate(model, grid);
  if (!run.ok()) return run.status();
  return std::make_pair(core::Imbalance(core::StageLoads(model, grid.boundaries)),
                        run->bubble_ratio);
}

}  // namespace dynmo::service::replay_internal
