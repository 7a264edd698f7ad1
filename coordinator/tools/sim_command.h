// What `dynmo-sim` computes, apart from printing and writing files: its
// flags read into the simulator's and the replay's configurations, the trace
// to replay (--trace FILE, read here, or a generated --scenario), and the
// results as the JSON the tool prints. The CLI and the Python binding
// (python/_core) share it, so both validate alike and fail with the same
// one-line messages (every error is INVALID_ARGUMENT).
//
//   one iteration:  SimulateCommand(args)   (--schedule, --microbatches, ...)
//   a replay:       ReplayCommand(args)     (--trace FILE | --scenario NAME)
//                   through the coordinator's own job machine
//
// Reads the --trace file, writes nothing; thread-compatible.
#ifndef DYNMO_COORDINATOR_TOOLS_SIM_COMMAND_H_
#define DYNMO_COORDINATOR_TOOLS_SIM_COMMAND_H_

#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "core/pipeline_sim.h"
#include "core/replay.h"
#include "core/trace.h"
#include "coordinator/tools/cli_args.h"
#include "nlohmann/json.hpp"

namespace dynmo::tools {

// Every flag of dynmo-sim that takes a value, and the switches.
const std::set<std::string>& SimValueFlags();
const std::set<std::string>& SimBoolFlags();

// True when the flags ask for a replay (--trace or --scenario).
bool IsReplay(const CliArgs& args);

struct SimRun {
  core::SimConfig config;
  core::SimResult result;
  nlohmann::ordered_json json;   // {"iteration_time":..,"bubble_ratio":..,..}
  std::string title;             // for the Gantt chart
  nlohmann::ordered_json perfetto;  // chrome trace-event JSON (--perfetto)
};

// One iteration of a schedule from the flags of the first mode.
absl::StatusOr<SimRun> SimulateCommand(const CliArgs& args);

struct ReplayRun {
  core::Trace trace;             // as replayed (after --layers)
  nlohmann::ordered_json json;   // {"source":..,"layers":..,"engine":..,...}
  // The coordinator's engine: static and DynMo iteration by iteration, plans
  // as instant events, as chrome trace-event JSON (--perfetto); null else.
  nlohmann::ordered_json perfetto;
};

// A trace replayed static against dynamic from the flags of the second mode.
// The coordinator's triggers (every:N, on-event, auto — the default —,
// manual) replay through the coordinator's own job machine
// (coordinator/job/job_replay.h) with --dp replicas and --elastic
// none|release|reshape; on-change[:T] runs the trace-only replay
// (core/replay.h), which is not the daemon's rule. --oracle adds the
// re-partition ceiling.
absl::StatusOr<ReplayRun> ReplayCommand(const CliArgs& args);

}  // namespace dynmo::tools

#endif  // DYNMO_COORDINATOR_TOOLS_SIM_COMMAND_H_
