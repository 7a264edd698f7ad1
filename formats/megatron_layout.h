// Megatron-LM's --pipeline-model-parallel-layout as DynMo boundaries and
// back: "E" the embedding, "t" a transformer layer, "L" the loss (head),
// "|" between stages, "x*N" and "(...)*N" repeats, commas ignored; e.g.
// "Et*2|t*2,L" is 0,3,6 over 6 layers. Used by plan_formats.h's Megatron
// format. Pure; thread-safe.
#ifndef DYNMO_FORMATS_MEGATRON_LAYOUT_H_
#define DYNMO_FORMATS_MEGATRON_LAYOUT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/boundaries.h"

namespace dynmo::formats {

// The most layers (and the largest repeat count) a split may name: far
// beyond any model, small enough that expanding a Megatron layout stays cheap.
inline constexpr int kMaxSplitLayers = 1 << 20;

// `b` (valid boundaries over at least 2 layers: the embedding and the head)
// as a layout.
std::string WriteMegatronLayout(absl::Span<const int> b);

// A layout as boundaries. `num_layers` / `num_stages` >= 0 are checked
// against it (< 0: not checked). INVALID_ARGUMENT, naming the layout (its
// first 80 characters), for a malformed layout, MTP layers ('m'), an empty
// stage, the embedding or loss missing, repeated or misplaced, or counts
// that disagree.
absl::StatusOr<core::Boundaries> ReadMegatronLayout(absl::string_view layout, int num_layers,
                                                    int num_stages);

}  // namespace dynmo::formats

#endif  // DYNMO_FORMATS_MEGATRON_LAYOUT_H_
