// Chrome trace-event JSON ({"traceEvents": [...]}, the format Perfetto's UI
// and chrome://tracing open) of what the simulator and the replay compute:
//
//   SimResultToChromeTrace   one simulated iteration: a track (thread) per
//                            stage, a slice per pass named as PyTorch's
//                            pipelining schedules name their actions,
//                            "PP:<stage>F<mb>" / "B" / "W" (GPipe and 1F1B
//                            run B and W as one "B" pass).
//   TimelineToChromeTrace    a replay: one track per run (static, DynMo), a
//                            slice per iteration as long as it took there,
//                            and instant events (plans decided and applied,
//                            with their reason, grid and bytes) on a track.
//
// Times are microseconds ("ts", "dur"), as the format wants. Pure;
// thread-compatible.
#ifndef DYNMO_FORMATS_CHROME_TRACE_H_
#define DYNMO_FORMATS_CHROME_TRACE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/pipeline_sim.h"
#include "nlohmann/json.hpp"

namespace dynmo::formats {

nlohmann::ordered_json SimResultToChromeTrace(const core::SimResult& result,
                                              absl::string_view title);

// Iterations laid end to end on each track.
struct TimelineTrack {
  std::string name;                 // "static", "DynMo"
  std::vector<int64_t> iterations;  // the iteration of each slice
  std::vector<double> seconds;      // how long it took
};

// An instant event at the start of `iteration` on track `track`.
struct TimelineMark {
  std::string track;
  int64_t iteration = 0;
  std::string name;                          // "plan 3 applied"
  std::map<std::string, std::string> args;   // shown in the event's details
};

nlohmann::ordered_json TimelineToChromeTrace(const std::vector<TimelineTrack>& tracks,
                                             const std::vector<TimelineMark>& marks,
                                             absl::string_view title);

}  // namespace dynmo::formats

#endif  // DYNMO_FORMATS_CHROME_TRACE_H_
