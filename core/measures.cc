#include "core/measures.h"

#include <algorithm>
#include <numeric>

namespace dynmo::core {

std::vector<double> StageLoads(const PipelineModel& model,
                               absl::Span<const int> b) {
  const LayerPrefix prefix(model.layers);
  const int k = static_cast<int>(b.size()) - 1;
  std::vector<double> loads(k);
  for (int s = 0; s < k; ++s) {
    loads[s] = StageTime(prefix, model.stages[s], model.link, s, k, b[s], b[s + 1]);
  }
  return loads;
}

std::vector<int64_t> StageMemoryUse(const PipelineModel& model,
                                    absl::Span<const int> b) {
  const LayerPrefix prefix(model.layers);
  const int k = static_cast<int>(b.size()) - 1;
  std::vector<int64_t> mem(k);
  for (int s = 0; s < k; ++s) {
    mem[s] = StageMemory(prefix, model.stages[s], b[s], b[s + 1]);
  }
  return mem;
}

double Imbalance(absl::Span<const double> loads) {
  if (loads.empty()) return 0;
  const double mean =
      std::accumulate(loads.begin(), loads.end(), 0.0) / loads.size();
  if (mean <= 0) return 0;
  const auto [lo, hi] = std::minmax_element(loads.begin(), loads.end());
  return (*hi - *lo) / mean;
}

double Bottleneck(absl::Span<const double> loads) {
  return loads.empty() ? 0 : *std::max_element(loads.begin(), loads.end());
}

double BottleneckLowerBound(const PipelineModel& model) {
  double total = 0, heaviest = 0, speed_sum = 0, fastest = 0;
  for (const LayerCost& l : model.layers) {
    total += l.time_s();
    heaviest = std::max(heaviest, l.time_s());
  }
  for (const StageSpec& s : model.stages) {
    speed_sum += s.speed;
    fastest = std::max(fastest, s.speed);
  }
  if (speed_sum <= 0) return 0;
  return std::max(total / speed_sum, heaviest / fastest);
}

std::vector<StagePassTimes> StagePassTimesFor(const PipelineModel& model,
                                              absl::Span<const int> b) {
  const LayerPrefix prefix(model.layers);
  const int k = static_cast<int>(b.size()) - 1;
  std::vector<StagePassTimes> out(k);
  for (int s = 0; s < k; ++s) {
    const double v = model.stages[s].speed;
    out[s].fwd_s = prefix.fwd(b[s], b[s + 1]) / v;
    out[s].bwd_s = prefix.bwd(b[s], b[s + 1]) / v;
    out[s].wgrad_s = prefix.wgrad(b[s], b[s + 1]) / v;
  }
  return out;
}

std::vector<StagePassTimes> StageBusyTimesFor(const PipelineModel& model,
                                              absl::Span<const int> b) {
  std::vector<StagePassTimes> out = StagePassTimesFor(model, b);
  const int k = static_cast<int>(out.size());
  for (int s = 0; s < k; ++s) {
    const StageSpec& stage = model.stages[static_cast<size_t>(s)];
    double extra = stage.exchange_s / stage.speed;
    if (s + 1 < k) extra += model.link.exposed_transfer_s();
    out[static_cast<size_t>(s)].fwd_s += extra / 2;
    out[static_cast<size_t>(s)].bwd_s += extra / 2;
  }
  return out;
}

absl::StatusOr<double> PredictedIterationTime(const PipelineModel& model,
                                              absl::Span<const int> b,
                                              Schedule schedule, int microbatches) {
  SimConfig config;
  config.schedule = schedule;
  config.microbatches = microbatches;
  config.stages = StageBusyTimesFor(model, b);
  if (model.link.overlapped && model.link.bandwidth_bytes_per_s > 0) {
    config.transfer_s = static_cast<double>(model.link.boundary_bytes) /
                        model.link.bandwidth_bytes_per_s;
  }
  absl::StatusOr<SimResult> sim = SimulatePipeline(config);
  if (!sim.ok()) return sim.status();
  return sim->iteration_time_s;
}

absl::StatusOr<double> PredictedBubbleRatio(const PipelineModel& model,
                                            absl::Span<const int> b,
                                            Schedule schedule,
                                            int microbatches) {
  SimConfig config;
  config.schedule = schedule;
  config.microbatches = microbatches;
  config.stages = StagePassTimesFor(model, b);
  if (model.link.bandwidth_bytes_per_s > 0) {
    config.transfer_s = static_cast<double>(model.link.boundary_bytes) /
                        model.link.bandwidth_bytes_per_s;
  }
  absl::StatusOr<SimResult> sim = SimulatePipeline(config);
  if (!sim.ok()) return sim.status();
  return sim->bubble_ratio;
}

PartitionSummary Summarize(const PipelineModel& model,
                           absl::Span<const int> b) {
  PartitionSummary out;
  out.loads = StageLoads(model, b);
  out.memory_bytes = StageMemoryUse(model, b);
  out.bottleneck = Bottleneck(out.loads);
  out.imbalance = Imbalance(out.loads);
  out.lower_bound = BottleneckLowerBound(model);
  return out;
}

}  // namespace dynmo::core
