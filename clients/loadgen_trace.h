// What dynmo-loadgen's simulated ranks replay: the decision core's scenario
// generator or a recorded JSON Lines trace, and the imbalance of one record
// under a layout (for its summary). Pure apart from reading the trace
// file; thread-compatible.
#ifndef DYNMO_CLIENTS_LOADGEN_TRACE_H_
#define DYNMO_CLIENTS_LOADGEN_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/trace.h"

namespace dynmo::clients {

struct LoadgenTraceSource {
  std::string scenario;    // a scenario name (core::ParseScenario), or
  std::string trace_file;  // a JSON Lines trace; exactly one is set
  int layers = 0;          // scenario layers; 0: max(48, 2 * stages)
  int iterations = 1;
  uint64_t seed = 1;
  int stages = 1;
};

// The trace; INVALID_ARGUMENT (one line) when both or neither source is
// given, the scenario is unknown, the file cannot be read or parsed, or it
// has fewer layers than stages.
absl::StatusOr<core::Trace> LoadgenTrace(const LoadgenTraceSource& source);

// max / mean - 1 of the stage loads of `record` split at `boundaries`.
double ImbalanceOf(const core::TraceRecord& record, const std::vector<int>& boundaries);

}  // namespace dynmo::clients

#endif  // DYNMO_CLIENTS_LOADGEN_TRACE_H_
