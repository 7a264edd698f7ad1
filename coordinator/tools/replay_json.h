// What dynmo-sim prints of a replay: the coordinator engine's result as the
// tool's JSON, its iterations and plans as a chrome trace-event timeline
// (Perfetto), and the trace-only replay's re-partition oracle. Used by
// sim_command.cc (the CLI and the Python binding share it).
// Pure; thread-compatible.
#ifndef DYNMO_COORDINATOR_TOOLS_REPLAY_JSON_H_
#define DYNMO_COORDINATOR_TOOLS_REPLAY_JSON_H_

#include <string>

#include "absl/status/statusor.h"
#include "core/replay.h"
#include "core/trace.h"
#include "coordinator/job/job_replay.h"
#include "nlohmann/json.hpp"

namespace dynmo::tools {

// The coordinator engine's result: grid, trigger, totals, speed-up, the
// ceilings with `oracle` (replay_bounds.h), GPU-hours, every plan.
nlohmann::ordered_json JobReplayToJson(const service::JobReplayResult& r,
                                       const service::JobReplayConfig& c,
                                       const std::string& elastic, double repack_tolerance,
                                       bool oracle);

// Static, DynMo (and the oracle, when asked) iteration by iteration, each
// plan decided and applied as an instant event on the DynMo track.
nlohmann::ordered_json ReplayTimeline(const service::JobReplayResult& r,
                                      const std::string& source);

// The trace-only replay's re-partition ceiling: each record on its own
// exact optimum over `c.stages` stages x `dp` replicas, moved for free.
absl::StatusOr<nlohmann::ordered_json> OracleJson(const core::Trace& trace,
                                                  const core::ReplayConfig& c, int dp,
                                                  double static_total_s);

}  // namespace dynmo::tools

#endif  // DYNMO_COORDINATOR_TOOLS_REPLAY_JSON_H_
