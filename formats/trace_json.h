// Traces (core/trace.h) as JSON Lines: one record per line, in order,
//
//   {"iter":0,"layers":[{"fwd":0.01,"bwd":0.01,"wgrad":0.01,"mem_bytes":805306368},...]}
//
// Times are seconds per micro-batch at speed 1; "mem_bytes" (resident bytes
// of the layer) may be left out and is then 0. Blank lines are skipped.
// Unknown keys are errors, so a misspelt field never silently reads as 0.
// Strings in, strings out: the caller owns the file. Thread-compatible.
#ifndef DYNMO_FORMATS_TRACE_JSON_H_
#define DYNMO_FORMATS_TRACE_JSON_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/trace.h"

namespace dynmo::formats {

// Parses and validates (core::ValidateTrace) a JSON Lines trace. Every error
// starts with the 1-based line it was found on: "line 3: ...".
absl::StatusOr<core::Trace> ParseTraceJsonl(absl::string_view text);

// One line per record, each ending in '\n'. Doubles are written with enough
// digits to read back bit for bit.
std::string TraceToJsonl(const core::Trace& trace);

}  // namespace dynmo::formats

#endif  // DYNMO_FORMATS_TRACE_JSON_H_
