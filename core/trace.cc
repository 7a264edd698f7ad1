#include "core/trace.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/cost_model.h"

namespace dynmo::core {

absl::Status ValidateTraceRecord(const TraceRecord& record,
                                 const TraceRecord* previous) {
  if (record.layers.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("iter ", record.iter, " has no layers"));
  }
  if (previous != nullptr) {
    if (record.layers.size() != previous->layers.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "iter ", record.iter, " has ", record.layers.size(),
          " layers but iter ", previous->iter, " has ", previous->layers.size(),
          "; every record must list the same layers"));
    }
    if (record.iter <= previous->iter) {
      return absl::InvalidArgumentError(
          absl::StrCat("iter ", record.iter, " follows iter ", previous->iter,
                       "; iters must be strictly increasing"));
    }
  }
  for (size_t i = 0; i < record.layers.size(); ++i) {
    const TraceLayer& l = record.layers[i];
    if (!FiniteNonNegative(l.fwd_s) || !FiniteNonNegative(l.bwd_s) ||
        !FiniteNonNegative(l.wgrad_s)) {
      return absl::InvalidArgumentError(
          absl::StrCat("iter ", record.iter, " layer ", i,
                       " has a negative or non-finite time (fwd=", l.fwd_s,
                       " bwd=", l.bwd_s, " wgrad=", l.wgrad_s, ")"));
    }
    if (l.mem_bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("iter ", record.iter, " layer ", i,
                       " has negative mem_bytes ", l.mem_bytes));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateTrace(const Trace& trace) {
  if (trace.empty()) {
    return absl::InvalidArgumentError("the trace has no records");
  }
  for (size_t k = 0; k < trace.size(); ++k) {
    absl::Status s =
        ValidateTraceRecord(trace[k], k == 0 ? nullptr : &trace[k - 1]);
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("record ", k, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

std::vector<LayerCost> LayerCostsOf(const TraceRecord& record) {
  std::vector<LayerCost> layers(record.layers.size());
  for (size_t i = 0; i < record.layers.size(); ++i) {
    const TraceLayer& t = record.layers[i];
    LayerCost& c = layers[i];
    c.id = static_cast<int>(i);
    c.fwd_s = t.fwd_s;
    c.bwd_s = t.bwd_s;
    c.wgrad_s = t.wgrad_s;
    c.resident_bytes = t.mem_bytes;
  }
  return layers;
}

}  // namespace dynmo::core
