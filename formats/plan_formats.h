// Plan formats: a split of pipeline layers over stages as other trainers
// take it, to and from DynMo's boundaries, so a split DynMo chose can be
// carried into a job that never runs DynMo (and a job's current split read
// back in).
//
// The layer model is torchtitan's Llama layout. Of L pipeline layers, layer 0
// is the token embedding, 1..L-2 the transformer blocks and L-1 the final
// norm with the output head; each framework names them its own way:
//
//   DynMo layer   torchtitan FQN            Megatron letter   DeepSpeed index
//   0             tok_embeddings            E                 0
//   k in 1..L-2   layers.<k-1>              t                 k
//   L-1           norm and output           L                 L-1
//
//   torchtitan  `module_fqns_per_model_part`: one list of module FQNs per
//               model part, [["tok_embeddings","layers.0"],["layers.1","norm","output"]]
//   Megatron    `--pipeline-model-parallel-layout`: "Et|t,L". '|' ends a
//               stage, "x*N" and "(...)*N" repeat, commas are cosmetic; MTP
//               layers ('m') have no DynMo layer and are refused
//   DeepSpeed   `PipelineModule.parts`: the boundaries themselves, [0,2,4]
//
// All of them list stages in model order, virtual stages included (an
// interleaved job's i-th model chunk is stage i), as boundaries do. A split
// with an empty stage, a layer in no stage or in two, or a stage whose layers
// are not contiguous has no boundaries and is refused. Half-block units
// (dynmo-train --pipeline_units=halves) have no name in these formats.
//
// Errors are INVALID_ARGUMENT with a one-line message. Pure; thread-safe.
#ifndef DYNMO_FORMATS_PLAN_FORMATS_H_
#define DYNMO_FORMATS_PLAN_FORMATS_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/boundaries.h"
#include "nlohmann/json.hpp"

namespace dynmo::formats {

enum class PlanFormat { kBoundaries, kTorchtitan, kMegatron, kDeepSpeed };

// Returns the format named "boundaries", "torchtitan", "megatron" or
// "deepspeed".
absl::StatusOr<PlanFormat> ParsePlanFormat(absl::string_view name);

// Returns the format's name, as ParsePlanFormat reads it.
absl::string_view PlanFormatName(PlanFormat format);

// Returns the key its framework gives the split: "boundaries",
// "module_fqns_per_model_part", "pipeline_model_parallel_layout", "parts".
absl::string_view PlanFormatKey(PlanFormat format);

// What a split read in must agree with; -1 takes the count from the split
// itself (the number of blocks, then, from the highest one it names).
struct SplitShape {
  int num_layers = -1;
  int num_stages = -1;
};

// Returns `b` in `format`: a list of FQN lists (torchtitan), a layout string
// (Megatron) or the boundaries (DeepSpeed, boundaries). `b` must be valid
// boundaries; torchtitan and Megatron need at least 2 layers.
absl::StatusOr<nlohmann::json> WriteSplit(PlanFormat format,
                                          absl::Span<const int> b);

// Returns the boundaries of a split given as the JSON value WriteSplit
// writes in `format`, checked against `shape`.
absl::StatusOr<core::Boundaries> ReadSplit(PlanFormat format,
                                           const nlohmann::json& value,
                                           SplitShape shape = {});

// Returns the boundaries of a split whose format its JSON type tells: an
// array of integers (boundaries, DeepSpeed parts), an array of arrays
// (torchtitan), a string (Megatron), or an object holding one of the keys
// PlanFormatKey names.
absl::StatusOr<core::Boundaries> ReadAnySplit(const nlohmann::json& value,
                                              SplitShape shape = {});

// Returns the boundaries of a split as typed on a command line: JSON (as
// ReadAnySplit reads it), comma-separated boundaries "0,3,8", or a bare
// Megatron layout "Et*2|t*2,L".
absl::StatusOr<core::Boundaries> ReadSplitText(absl::string_view text,
                                               SplitShape shape = {});

}  // namespace dynmo::formats

#endif  // DYNMO_FORMATS_PLAN_FORMATS_H_
