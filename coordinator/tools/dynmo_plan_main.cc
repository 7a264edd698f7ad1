// dynmo-plan: partition (and optionally re-pack) a pipeline from a JSON
// problem on FILE or stdin; print the decision as JSON on stdout.
//
//   dynmo-plan --method {uniform,parameters,time,optimal,diffusion}
//              [--rounds N] [--repack [--tolerance X]
//              [--repack-method {optimal,first-fit} --target-stages K]] [FILE]
//
// Every input or usage error prints one line on stderr and exits with 2.
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "cli/program_info.h"
#include "coordinator/core/measures.h"
#include "coordinator/core/migration.h"
#include "coordinator/core/partition.h"
#include "coordinator/core/repack.h"
#include "coordinator/formats/problem_json.h"
#include "coordinator/tools/cli_args.h"
#include "nlohmann/json.hpp"

namespace {

using dynmo::tools::FailUsage;
using nlohmann::json;
namespace core = dynmo::core;
namespace formats = dynmo::formats;

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

json Decision(const core::PipelineModel& model, const core::Boundaries& b,
              const core::MigrationPlan& migration) {
  core::PartitionSummary summary = core::Summarize(model, b);
  json out = formats::SummaryToJson(summary);
  out["boundaries"] = b;
  out["migrations"] = formats::MigrationToJson(migration);
  out["moved_bytes"] = migration.total_bytes;
  out["migration_rounds"] = migration.rounds;
  return out;
}

int Run(int argc, char** argv) {
  absl::StatusOr<dynmo::tools::CliArgs> args = dynmo::tools::CliArgs::Parse(
      argc, argv,
      {"method", "rounds", "tolerance", "repack-method", "target-stages"},
      {"repack"});
  if (!args.ok()) return FailUsage(kTool, args.status().message());
  absl::StatusOr<core::PartitionMethod> method =
      core::ParsePartitionMethod(args->Get("method").value_or("optimal"));
  if (!method.ok()) return FailUsage(kTool, method.status().message());
  absl::StatusOr<std::optional<int>> rounds = args->GetInt("rounds");
  absl::StatusOr<std::optional<double>> tolerance = args->GetDouble("tolerance");
  absl::StatusOr<std::optional<int>> target = args->GetInt("target-stages");
  for (const absl::Status& st :
       {rounds.status(), tolerance.status(), target.status()}) {
    if (!st.ok()) return FailUsage(kTool, st.message());
  }
  const bool repack = args->Has("repack");
  const std::string repack_method = args->Get("repack-method").value_or("optimal");
  if (!repack && (args->Has("tolerance") || args->Has("repack-method") ||
                  args->Has("target-stages"))) {
    return FailUsage(kTool, "--tolerance, --repack-method and --target-stages "
                            "need --repack");
  }
  if (repack_method != "optimal" && repack_method != "first-fit") {
    return FailUsage(kTool, absl::StrCat("unknown --repack-method '",
                                         repack_method, "' (optimal, first-fit)"));
  }
  if (repack && *method != core::PartitionMethod::kOptimal) {
    return FailUsage(kTool, "--repack re-partitions exactly: use --method optimal");
  }
  absl::StatusOr<std::string> text = ReadInput(args->positional());
  if (!text.ok()) return FailUsage(kTool, text.status().message());
  absl::StatusOr<formats::PlanProblem> problem = formats::ParsePlanProblem(*text);
  if (!problem.ok()) return FailUsage(kTool, problem.status().message());
  const core::PipelineModel& model = problem->model;
  if (absl::Status st = core::ValidateModel(model); !st.ok()) {
    return FailUsage(kTool, st.message());
  }

  json out;
  out["method"] = core::PartitionMethodName(*method);
  if (!repack) {
    core::PartitionOptions options;
    options.method = *method;
    options.current = problem->current;
    if (rounds->has_value()) options.diffusion_max_rounds = **rounds;
    absl::StatusOr<core::PartitionResult> result = core::Partition(model, options);
    if (!result.ok()) return FailUsage(kTool, result.status().message());
    core::MigrationPlan migration;
    if (problem->current) {
      migration = *core::PlanMigrationBetween(model.layers, *problem->current,
                                              result->boundaries);
    }
    out.update(Decision(model, result->boundaries, migration));
    if (*method == core::PartitionMethod::kDiffusion) {
      out["diffusion_rounds"] = result->diffusion_rounds;
      out["diffusion_converged"] = result->diffusion_converged;
    }
  } else if (repack_method == "optimal") {
    core::RepackOptions options;
    options.current = problem->current;
    if (tolerance->has_value()) options.tolerance = **tolerance;
    absl::StatusOr<core::RepackResult> r = core::RepackOptimal(model, options);
    if (!r.ok()) return FailUsage(kTool, r.status().message());
    core::PipelineModel active = model;
    active.stages.clear();
    for (int s : r->active_stages) active.stages.push_back(model.stages[s]);
    out.update(Decision(active, r->boundaries, r->migration));
    out["method"] = "optimal+repack";
    out["active_stages"] = r->active_stages;
    out["released_stages"] = r->released_stages;
    out["comm_split"] = formats::CommSplitToJson(r->split);
    out["reference_bottleneck"] = r->reference_bottleneck;
  } else {
    const int k = static_cast<int>(model.stages.size());
    const int n = static_cast<int>(model.layers.size());
    if (!problem->current && k > n) {
      return FailUsage(kTool, "first-fit needs a \"current\" partition when "
                              "there are more stages than layers");
    }
    core::Boundaries current =
        problem->current.value_or(core::PartitionUniform(n, k));
    absl::StatusOr<core::FirstFitResult> r =
        core::RepackFirstFit(model, current, target->value_or(1));
    if (!r.ok()) return FailUsage(kTool, r.status().message());
    out["method"] = "first-fit";
    out["layer_owner"] = r->layer_owner;
    out["contiguous"] = r->contiguous;
    out["active_stages"] = r->active_stages;
    out["released_stages"] = r->released_stages;
    out["migrations"] = formats::MigrationToJson(r->migration);
    out["moved_bytes"] = r->migration.total_bytes;
  }
  std::cout << out.dump() << "\n";
  return 0;
}

}  // namespace

constexpr char kPlanUsage[] =
    "usage: dynmo-plan --method {uniform,parameters,time,optimal,diffusion}\n"
    "                  [--rounds N] [--repack [--tolerance X]\n"
    "                  [--repack-method {optimal,first-fit} --target-stages K]] [FILE]\n"
    "reads a JSON problem from FILE or stdin, prints the decision as JSON";

int main(int argc, char** argv) {
  if (dynmo::cli::HandleHelpOrVersion(argc, argv, "dynmo-plan", kPlanUsage)) return 0;
  return Run(argc, argv);
}
