// Stretching a trace to another depth: a profile recorded on a small model
// (the CPU trainer's 8 blocks) replayed at the paper's scale (48 layers).
//
// A trainer trace's first and last layers are the embedding and the LM head
// + loss; they stay one layer each. The interior layers (the transformer
// blocks) are resampled by relative depth: target block j of n' takes the
// profile of source block floor((j + 0.5) * n / n'), so the depth pattern of
// the dynamism (a frozen prefix, tokens thinning out towards the end, every
// other block routed) keeps its shape while each layer keeps its measured
// cost. Pure; thread-compatible.
#ifndef DYNMO_CORE_TRACE_DEPTH_H_
#define DYNMO_CORE_TRACE_DEPTH_H_

#include "absl/status/statusor.h"
#include "core/trace.h"

namespace dynmo::core {

// Returns `trace` with every record stretched (or shrunk) to `num_layers`
// layers, the first and last kept as they are. Errors: an invalid trace,
// fewer than 3 layers in it (no interior to stretch) or `num_layers` < 3.
absl::StatusOr<Trace> ResampleTraceDepth(const Trace& trace, int num_layers);

}  // namespace dynmo::core

#endif  // DYNMO_CORE_TRACE_DEPTH_H_
