// ReadReport: one iteration report as the coordinator takes it in — every
// field checked (ranges, NaN, the job's layer count, no layer twice,
// limits.h's bounds) and its layers decoded to core::LayerCost in the same
// pass, so a report is read once and nothing downstream sees an unchecked
// field. Errors are INVALID_ARGUMENT naming the offending field. The agent
// checks what it sends on its side (agent/rank_state.h); checks that need
// the job's state (the rank, its stage, the epoch, the iteration window)
// are the coordinator's (coordinator/job/upstream_checks.h).
// Pure; thread-safe.
#ifndef DYNMO_WIRE_REPORT_CODEC_H_
#define DYNMO_WIRE_REPORT_CODEC_H_

#include <vector>

#include "absl/status/statusor.h"
#include "core/cost_model.h"
#include "dynmo/v1/agent.pb.h"

namespace dynmo::wire {

// The report's layers (id = each sample's layer), in the report's order.
absl::StatusOr<std::vector<core::LayerCost>> ReadReport(
    const dynmo::v1::IterationReport& report, int num_layers);

}  // namespace dynmo::wire

#endif  // DYNMO_WIRE_REPORT_CODEC_H_
