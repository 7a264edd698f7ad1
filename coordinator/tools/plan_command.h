// What `dynmo-plan` decides, apart from reading files and printing: its
// flags read into a PlanRequest, and the decision for a problem's JSON text
// as the JSON the tool prints, the decided split also in other trainers'
// formats when asked (formats/plan_formats.h). The CLI and the Python binding
// (python/_core) share it, so both validate alike and fail with the same
// one-line messages (every error is INVALID_ARGUMENT).
//
//   PlanRequest r = *PlanRequestFromArgs(args);   // flags only, no input yet
//   nlohmann::json decision = *DecidePlan(r, problem_text);
//
// Pure (no files, clocks or sockets); thread-compatible.
#ifndef DYNMO_COORDINATOR_TOOLS_PLAN_COMMAND_H_
#define DYNMO_COORDINATOR_TOOLS_PLAN_COMMAND_H_

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/partition.h"
#include "formats/plan_formats.h"
#include "coordinator/tools/cli_args.h"
#include "nlohmann/json.hpp"

namespace dynmo::tools {

// dynmo-plan's flags that take a value, and its boolean ones.
const std::set<std::string>& PlanValueFlags();
const std::set<std::string>& PlanBoolFlags();

struct PlanRequest {
  core::PartitionMethod method = core::PartitionMethod::kOptimal;
  std::optional<int> rounds;          // --rounds (diffusion)
  bool repack = false;
  std::string repack_method = "optimal";  // or "first-fit"
  std::optional<double> tolerance;    // --tolerance (optimal re-pack)
  std::optional<int> target_stages;   // --target-stages (first-fit)
  // --current: the current split in any plan format (ReadSplitText); it
  // replaces the problem's "current".
  std::optional<std::string> current;
  // --layout-format: the formats the decided split is also written in, each
  // under its framework's key (PlanFormatKey).
  std::vector<formats::PlanFormat> layout_formats;
};

// Reads and cross-checks the flags (positional arguments are ignored).
absl::StatusOr<PlanRequest> PlanRequestFromArgs(const CliArgs& args);

// Parses and validates the problem, decides, and returns the decision as
// dynmo-plan prints it (README, "dynmo-plan").
absl::StatusOr<nlohmann::json> DecidePlan(const PlanRequest& request,
                                          absl::string_view problem_text);

}  // namespace dynmo::tools

#endif  // DYNMO_COORDINATOR_TOOLS_PLAN_COMMAND_H_
