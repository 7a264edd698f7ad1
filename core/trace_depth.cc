#include "core/trace_depth.h"

#include "absl/strings/str_cat.h"

namespace dynmo::core {

absl::StatusOr<Trace> ResampleTraceDepth(const Trace& trace, int num_layers) {
  if (absl::Status s = ValidateTrace(trace); !s.ok()) return s;
  const int source_layers = static_cast<int>(trace.front().layers.size());
  if (source_layers < 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the trace has ", source_layers,
        " layers; stretching it needs a first, a last and at least one interior layer"));
  }
  if (num_layers < 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot stretch a trace to ", num_layers, " layers (need >= 3)"));
  }
  const int source_interior = source_layers - 2;
  const int target_interior = num_layers - 2;
  Trace out;
  out.reserve(trace.size());
  for (const TraceRecord& record : trace) {
    TraceRecord r;
    r.iter = record.iter;
    r.layers.reserve(num_layers);
    r.layers.push_back(record.layers.front());
    for (int j = 0; j < target_interior; ++j) {
      // Integer form of floor((j + 0.5) * n / n'): exact, no rounding drift.
      const int64_t source =
          (static_cast<int64_t>(2 * j + 1) * source_interior) / (2 * target_interior);
      r.layers.push_back(record.layers[1 + source]);
    }
    r.layers.push_back(record.layers.back());
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace dynmo::core
