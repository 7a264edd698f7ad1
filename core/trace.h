// A trace: per-layer profiles of a dynamic model, one record per training
// iteration, in the order they were measured. It is what the trainer's
// profiler emits after each dynamism event (the paper's Algorithm 1, line 14)
// and what the scenario generator (scenario.h) synthesises, so the replay
// (replay.h) can compare static and dynamic balancing on either.
//
// Every record lists the same layers in pipeline order. Times are seconds per
// micro-batch on a stage of speed 1, split into forward (F), input gradient
// (B) and weight gradient (W) as ZB-H1 needs; mem_bytes is the layer's
// resident state (weights, grads, optimizer state), which is what a migration
// moves. Plain data; thread-compatible.
#ifndef DYNMO_CORE_TRACE_H_
#define DYNMO_CORE_TRACE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/cost_model.h"

namespace dynmo::core {

struct TraceLayer {
  double fwd_s = 0;
  double bwd_s = 0;    // input gradient
  double wgrad_s = 0;  // weight gradient
  int64_t mem_bytes = 0;
};

struct TraceRecord {
  int64_t iter = 0;  // training iteration the profile was taken at
  std::vector<TraceLayer> layers;
};

using Trace = std::vector<TraceRecord>;

// Returns OK when `record` has at least one layer, every time is finite and
// non-negative, every size is non-negative, and, when `previous` is given, it
// has previous's layer count and a strictly larger iter. Messages name the
// iter and the layer at fault; callers add where the record came from.
absl::Status ValidateTraceRecord(const TraceRecord& record,
                                 const TraceRecord* previous);

// Returns OK when `trace` is non-empty and every record passes
// ValidateTraceRecord against the one before it. Messages start with the
// record's position ("record 3: iter 40 layer 2 has ...").
absl::Status ValidateTrace(const Trace& trace);

// The cost model's view of one record: layer i becomes LayerCost{id = i} with
// the record's F/B/W times and mem_bytes as its resident bytes. Parameter
// counts and activation sizes are not traced and stay 0.
std::vector<LayerCost> LayerCostsOf(const TraceRecord& record);

}  // namespace dynmo::core

#endif  // DYNMO_CORE_TRACE_H_
