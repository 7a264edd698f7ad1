#include "coordinator/tools/plan_command.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/measures.h"
#include "core/migration.h"
#include "core/repack.h"
#include "formats/problem_json.h"

namespace dynmo::tools {
namespace {

using nlohmann::json;
namespace formats = dynmo::formats;

absl::Status Bad(absl::string_view message) {
  return absl::InvalidArgumentError(message);
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

absl::StatusOr<json> Partitioned(const PlanRequest& request,
                                 const formats::PlanProblem& problem) {
  const core::PipelineModel& model = problem.model;
  core::PartitionOptions options;
  options.method = request.method;
  options.current = problem.current;
  if (request.rounds) options.diffusion_max_rounds = *request.rounds;
  absl::StatusOr<core::PartitionResult> result = core::Partition(model, options);
  if (!result.ok()) return Bad(result.status().message());
  core::MigrationPlan migration;
  if (problem.current) {
    migration = *core::PlanMigrationBetween(model.layers, *problem.current,
                                            result->boundaries);
  }
  json out = Decision(model, result->boundaries, migration);
  if (request.method == core::PartitionMethod::kDiffusion) {
    out["diffusion_rounds"] = result->diffusion_rounds;
    out["diffusion_converged"] = result->diffusion_converged;
  }
  return out;
}

absl::StatusOr<json> RepackedOptimal(const PlanRequest& request,
                                     const formats::PlanProblem& problem) {
  const core::PipelineModel& model = problem.model;
  core::RepackOptions options;
  options.current = problem.current;
  if (request.tolerance) options.tolerance = *request.tolerance;
  absl::StatusOr<core::RepackResult> r = core::RepackOptimal(model, options);
  if (!r.ok()) return Bad(r.status().message());
  core::PipelineModel active = model;
  active.stages.clear();
  for (int s : r->active_stages) active.stages.push_back(model.stages[s]);
  json out = Decision(active, r->boundaries, r->migration);
  out["method"] = "optimal+repack";
  out["active_stages"] = r->active_stages;
  out["released_stages"] = r->released_stages;
  out["comm_split"] = formats::CommSplitToJson(r->split);
  out["reference_bottleneck"] = r->reference_bottleneck;
  return out;
}

absl::StatusOr<json> RepackedFirstFit(const PlanRequest& request,
                                      const formats::PlanProblem& problem) {
  const core::PipelineModel& model = problem.model;
  const int k = static_cast<int>(model.stages.size());
  const int n = static_cast<int>(model.layers.size());
  if (!problem.current && k > n) {
    return Bad("first-fit needs a \"current\" partition when there are more "
               "stages than layers");
  }
  core::Boundaries current =
      problem.current.value_or(core::PartitionUniform(n, k));
  absl::StatusOr<core::FirstFitResult> r =
      core::RepackFirstFit(model, current, request.target_stages.value_or(1));
  if (!r.ok()) return Bad(r.status().message());
  json out;
  out["method"] = "first-fit";
  out["layer_owner"] = r->layer_owner;
  out["contiguous"] = r->contiguous;
  out["active_stages"] = r->active_stages;
  out["released_stages"] = r->released_stages;
  out["migrations"] = formats::MigrationToJson(r->migration);
  out["moved_bytes"] = r->migration.total_bytes;
  return out;
}

// --layout-format's comma-separated list, each format once.
absl::StatusOr<std::vector<formats::PlanFormat>> LayoutFormats(absl::string_view list) {
  std::vector<formats::PlanFormat> out;
  for (absl::string_view name : absl::StrSplit(list, ',')) {
    absl::StatusOr<formats::PlanFormat> f = formats::ParsePlanFormat(name);
    if (!f.ok() || *f == formats::PlanFormat::kBoundaries) {
      return Bad(absl::StrCat("--layout-format: unknown format '", name,
                              "' (torchtitan, megatron, deepspeed)"));
    }
    if (std::find(out.begin(), out.end(), *f) != out.end()) {
      return Bad(absl::StrCat("--layout-format names ", name, " twice"));
    }
    out.push_back(*f);
  }
  return out;
}

// Adds the decided boundaries in each requested format, under its key.
absl::Status AddLayouts(const std::vector<formats::PlanFormat>& layout_formats,
                        json& decision) {
  if (layout_formats.empty()) return absl::OkStatus();
  const core::Boundaries b = decision.at("boundaries").get<core::Boundaries>();
  for (formats::PlanFormat f : layout_formats) {
    absl::StatusOr<json> written = formats::WriteSplit(f, b);
    if (!written.ok()) {
      return Bad(absl::StrCat("--layout-format ", formats::PlanFormatName(f), ": ",
                              written.status().message()));
    }
    decision[std::string(formats::PlanFormatKey(f))] = *std::move(written);
  }
  return absl::OkStatus();
}

}  // namespace

const std::set<std::string>& PlanValueFlags() {
  static const auto* flags = new std::set<std::string>{
      "method",        "rounds",  "tolerance",    "repack-method",
      "target-stages", "current", "layout-format"};
  return *flags;
}

const std::set<std::string>& PlanBoolFlags() {
  static const auto* flags = new std::set<std::string>{"repack"};
  return *flags;
}

absl::StatusOr<PlanRequest> PlanRequestFromArgs(const CliArgs& args) {
  PlanRequest request;
  absl::StatusOr<core::PartitionMethod> method =
      core::ParsePartitionMethod(args.Get("method").value_or("optimal"));
  if (!method.ok()) return Bad(method.status().message());
  request.method = *method;
  absl::StatusOr<std::optional<int>> rounds = args.GetInt("rounds");
  absl::StatusOr<std::optional<double>> tolerance = args.GetDouble("tolerance");
  absl::StatusOr<std::optional<int>> target = args.GetInt("target-stages");
  for (const absl::Status& st :
       {rounds.status(), tolerance.status(), target.status()}) {
    if (!st.ok()) return Bad(st.message());
  }
  request.rounds = *rounds;
  request.tolerance = *tolerance;
  request.target_stages = *target;
  request.repack = args.Has("repack");
  request.repack_method = args.Get("repack-method").value_or("optimal");
  if (!request.repack && (args.Has("tolerance") || args.Has("repack-method") ||
                          args.Has("target-stages"))) {
    return Bad("--tolerance, --repack-method and --target-stages need --repack");
  }
  if (request.repack_method != "optimal" && request.repack_method != "first-fit") {
    return Bad(absl::StrCat("unknown --repack-method '", request.repack_method,
                            "' (optimal, first-fit)"));
  }
  if (request.repack && request.method != core::PartitionMethod::kOptimal) {
    return Bad("--repack re-partitions exactly: use --method optimal");
  }
  request.current = args.Get("current");
  if (std::optional<std::string> list = args.Get("layout-format")) {
    absl::StatusOr<std::vector<formats::PlanFormat>> formats = LayoutFormats(*list);
    if (!formats.ok()) return formats.status();
    request.layout_formats = *std::move(formats);
    if (request.repack && request.repack_method == "first-fit") {
      return Bad("--layout-format writes boundaries; first-fit gives layer owners");
    }
  }
  return request;
}

absl::StatusOr<json> DecidePlan(const PlanRequest& request,
                                absl::string_view problem_text) {
  absl::StatusOr<formats::PlanProblem> problem =
      formats::ParsePlanProblem(problem_text);
  if (!problem.ok()) return Bad(problem.status().message());
  if (request.current) {
    absl::StatusOr<core::Boundaries> current = formats::ReadSplitText(
        *request.current, {static_cast<int>(problem->model.layers.size()),
                           static_cast<int>(problem->model.stages.size())});
    if (!current.ok()) return Bad(absl::StrCat("--current: ", current.status().message()));
    problem->current = *std::move(current);
  }
  if (absl::Status st = core::ValidateModel(problem->model); !st.ok()) {
    return Bad(st.message());
  }
  absl::StatusOr<json> decision;
  if (!request.repack) {
    decision = Partitioned(request, *problem);
  } else if (request.repack_method == "optimal") {
    decision = RepackedOptimal(request, *problem);
  } else {
    decision = RepackedFirstFit(request, *problem);
  }
  if (!decision.ok()) return decision.status();
  json out;
  out["method"] = core::PartitionMethodName(request.method);
  out.update(*decision);
  if (absl::Status st = AddLayouts(request.layout_formats, out); !st.ok()) return st;
  return out;
}

}  // namespace dynmo::tools
