// dynmo-plan: partition (and optionally re-pack) a pipeline from a JSON
// problem on FILE or stdin; print the decision as JSON on stdout.
//
//   dynmo-plan --method {uniform,parameters,time,optimal,diffusion}
//              [--rounds N] [--repack [--tolerance X]
//              [--repack-method {optimal,first-fit} --target-stages K]]
//              [--current SPLIT] [--layout-format FORMAT[,FORMAT...]] [FILE]
//
// --current and --layout-format read and write a split the way torchtitan,
// Megatron-LM and DeepSpeed take it (formats/plan_formats.h).
//
// Every input or usage error prints one line on stderr and exits with 2.
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "cli/program_info.h"
#include "coordinator/tools/cli_args.h"
#include "coordinator/tools/plan_command.h"
#include "nlohmann/json.hpp"

namespace {

using dynmo::tools::FailUsage;

constexpr char kTool[] = "dynmo-plan";

absl::StatusOr<std::string> ReadInput(const std::vector<std::string>& files) {
  if (files.size() > 1) {
    return absl::InvalidArgumentError("give at most one problem file");
  }
  std::ostringstream text;
  if (files.empty() || files[0] == "-") {
    text << std::cin.rdbuf();
  } else {
    std::ifstream in(files[0]);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read problem file '", files[0], "'"));
    }
    text << in.rdbuf();
  }
  return text.str();
}

int Run(int argc, char** argv) {
  absl::StatusOr<dynmo::tools::CliArgs> args = dynmo::tools::CliArgs::Parse(
      argc, argv, dynmo::tools::PlanValueFlags(), dynmo::tools::PlanBoolFlags());
  if (!args.ok()) return FailUsage(kTool, args.status().message());
  absl::StatusOr<dynmo::tools::PlanRequest> request =
      dynmo::tools::PlanRequestFromArgs(*args);
  if (!request.ok()) return FailUsage(kTool, request.status().message());
  absl::StatusOr<std::string> text = ReadInput(args->positional());
  if (!text.ok()) return FailUsage(kTool, text.status().message());
  absl::StatusOr<nlohmann::json> decision = dynmo::tools::DecidePlan(*request, *text);
  if (!decision.ok()) return FailUsage(kTool, decision.status().message());
  std::cout << decision->dump() << "\n";
  return 0;
}

}  // namespace

constexpr char kPlanUsage[] =
    "usage: dynmo-plan --method {uniform,parameters,time,optimal,diffusion}\n"
    "                  [--rounds N] [--repack [--tolerance X]\n"
    "                  [--repack-method {optimal,first-fit} --target-stages K]]\n"
    "                  [--current SPLIT] [--layout-format FORMAT[,FORMAT...]] [FILE]\n"
    "reads a JSON problem from FILE or stdin, prints the decision as JSON\n"
    "  --current SPLIT   the current split, replacing the problem's \"current\":\n"
    "                    boundaries (0,3,8 or [0,3,8]; DeepSpeed's parts), a\n"
    "                    Megatron layout (Et*2|t*3,L) or torchtitan's\n"
    "                    module_fqns_per_model_part as JSON\n"
    "  --layout-format   also print the decided split as torchtitan's\n"
    "                    \"module_fqns_per_model_part\", Megatron's\n"
    "                    \"pipeline_model_parallel_layout\" and/or DeepSpeed's \"parts\"\n"
    "                    (torchtitan, megatron, deepspeed); layer 0 is the embedding,\n"
    "                    the last the final norm + output head (docs/plan-formats.md)";

int main(int argc, char** argv) {
  if (dynmo::cli::HandleHelpOrVersion(argc, argv, "dynmo-plan", kPlanUsage)) return 0;
  return Run(argc, argv);
}
