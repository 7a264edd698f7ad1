// Measures of a partition: per-stage load, the paper's imbalance
// ΔL = (Lmax - Lmin) / mean, the bottleneck (slowest stage), lower bounds on
// any partition's bottleneck, and the predicted bubble ratio of a schedule.
// Stage loads are StageTime (cost_model.h): compute / speed + exposed link.
#ifndef DYNMO_CORE_MEASURES_H_
#define DYNMO_CORE_MEASURES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/boundaries.h"
#include "core/cost_model.h"
#include "core/pipeline_sim.h"

namespace dynmo::core {

// Seconds per micro-batch of each stage under boundaries `b` (must be valid).
std::vector<double> StageLoads(const PipelineModel& model,
                               absl::Span<const int> b);

// Peak bytes of each stage under `b`.
std::vector<int64_t> StageMemoryUse(const PipelineModel& model,
                                    absl::Span<const int> b);

// (max - min) / mean of `loads`; 0 when the mean is 0 or loads is empty.
double Imbalance(absl::Span<const double> loads);

// max of `loads` (0 when empty).
double Bottleneck(absl::Span<const double> loads);

// No partition of `model` can have a bottleneck below this: the larger of
// total work over total speed and the heaviest single layer on the fastest
// stage (each plus the link time the stage must pay when S > 1 is counted
// only where it is unavoidable, i.e. not at all: a valid bound either way).
double BottleneckLowerBound(const PipelineModel& model);

// Per-stage F / B / W seconds of a partition, for the simulator. The exposed
// link time is passed separately to the simulator as its transfer time.
std::vector<StagePassTimes> StagePassTimesFor(const PipelineModel& model,
                                              absl::Span<const int> b);

// StagePassTimesFor plus the rest of what StageLoads counts per
// micro-batch: each stage's exchanges (StageSpec::exchange_s at its speed)
// and, for a non-last stage, a link transfer that is not overlapped, split
// evenly between the forward and the input-gradient pass. The sum of each
// stage's three passes is its StageLoads entry.
std::vector<StagePassTimes> StageBusyTimesFor(const PipelineModel& model,
                                              absl::Span<const int> b);

// Seconds the simulator predicts one iteration of `schedule` with
// `microbatches` micro-batches takes on partition `b`, every stage busy
// for its StageBusyTimesFor and an overlapped link's transfer as the hop
// between stages: what a plan changes in a pipeline's step time (its
// bottleneck over the steady phase, every stage in the fill and drain).
absl::StatusOr<double> PredictedIterationTime(const PipelineModel& model,
                                              absl::Span<const int> b,
                                              Schedule schedule, int microbatches);

// Bubble ratio the simulator predicts for one iteration of `schedule` with
// `microbatches` micro-batches on partition `b`.
absl::StatusOr<double> PredictedBubbleRatio(const PipelineModel& model,
                                            absl::Span<const int> b,
                                            Schedule schedule,
                                            int microbatches);

// Everything above for one partition.
struct PartitionSummary {
  std::vector<double> loads;
  std::vector<int64_t> memory_bytes;
  double bottleneck = 0;
  double imbalance = 0;
  double lower_bound = 0;
};
PartitionSummary Summarize(const PipelineModel& model, absl::Span<const int> b);

}  // namespace dynmo::core

#endif  // DYNMO_CORE_MEASURES_H_
