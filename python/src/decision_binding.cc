#include "python/src/decision_binding.h"

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/pipeline_sim.h"
#include "formats/plan_formats.h"
#include "coordinator/tools/cli_args.h"
#include "coordinator/tools/plan_command.h"
#include "coordinator/tools/sim_command.h"
#include "pybind11/stl.h"
#include "python/src/status_error.h"

namespace dynmo::python {
namespace {

namespace py = pybind11;
using tools::CliArgs;

// The flags as the tool's command line would parse them; no positional
// arguments (the binding passes the input itself).
absl::StatusOr<CliArgs> ParseFlags(const char* tool,
                                   const std::vector<std::string>& flags,
                                   const std::set<std::string>& value_flags,
                                   const std::set<std::string>& bool_flags) {
  std::vector<const char*> argv = {tool};
  for (const std::string& f : flags) argv.push_back(f.c_str());
  absl::StatusOr<CliArgs> args = CliArgs::Parse(
      static_cast<int>(argv.size()), argv.data(), value_flags, bool_flags);
  if (!args.ok()) return args.status();
  if (!args->positional().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", args->positional().front(), "'"));
  }
  return args;
}

// Flags that make the programs write files; the binding returns data instead.
absl::Status RejectFileFlags(const CliArgs& args) {
  for (const char* f : {"svg", "write-trace", "perfetto"}) {
    if (args.Has(f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", f, " writes a file: not available here"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> PlanJson(const std::string& problem,
                                     const std::vector<std::string>& flags) {
  absl::StatusOr<CliArgs> args = ParseFlags(
      "dynmo-plan", flags, tools::PlanValueFlags(), tools::PlanBoolFlags());
  if (!args.ok()) return args.status();
  absl::StatusOr<tools::PlanRequest> request = tools::PlanRequestFromArgs(*args);
  if (!request.ok()) return request.status();
  absl::StatusOr<nlohmann::json> decision = tools::DecidePlan(*request, problem);
  if (!decision.ok()) return decision.status();
  return decision->dump();
}

absl::StatusOr<std::pair<std::string, std::optional<std::string>>> SimulateJson(
    const std::vector<std::string>& flags, bool gantt) {
  absl::StatusOr<CliArgs> args =
      ParseFlags("dynmo-sim", flags, tools::SimValueFlags(), {});
  if (!args.ok()) return args.status();
  if (absl::Status s = RejectFileFlags(*args); !s.ok()) return s;
  if (tools::IsReplay(*args)) {
    return absl::InvalidArgumentError(
        "--trace and --scenario replay a trace: use replay()");
  }
  absl::StatusOr<tools::SimRun> run = tools::SimulateCommand(*args);
  if (!run.ok()) return run.status();
  std::optional<std::string> svg;
  if (gantt) svg = core::RenderGanttSvg(run->result, run->title);
  return std::make_pair(run->json.dump(), std::move(svg));
}

absl::StatusOr<std::string> ReplayJson(const std::vector<std::string>& flags) {
  absl::StatusOr<CliArgs> args =
      ParseFlags("dynmo-sim", flags, tools::SimValueFlags(), tools::SimBoolFlags());
  if (!args.ok()) return args.status();
  if (absl::Status s = RejectFileFlags(*args); !s.ok()) return s;
  absl::StatusOr<tools::ReplayRun> run = tools::ReplayCommand(*args);
  if (!run.ok()) return run.status();
  return run->json.dump();
}

// A split written in the plan format `format`, as JSON text.
absl::StatusOr<std::string> SplitWrite(const std::string& format,
                                       const std::vector<int>& boundaries) {
  absl::StatusOr<formats::PlanFormat> f = formats::ParsePlanFormat(format);
  if (!f.ok()) return f.status();
  absl::StatusOr<nlohmann::json> written = formats::WriteSplit(*f, boundaries);
  if (!written.ok()) return written.status();
  return written->dump();
}

// The boundaries of a split given as JSON text in the plan format `format`.
absl::StatusOr<core::Boundaries> SplitRead(const std::string& format,
                                           const std::string& value_json,
                                           int num_layers, int num_stages) {
  absl::StatusOr<formats::PlanFormat> f = formats::ParsePlanFormat(format);
  if (!f.ok()) return f.status();
  nlohmann::json value = nlohmann::json::parse(value_json, nullptr,
                                               /*allow_exceptions=*/false);
  if (value.is_discarded()) return absl::InvalidArgumentError("split is not valid JSON");
  return formats::ReadSplit(*f, value, {num_layers, num_stages});
}

// Runs `f` without the GIL, then raises its error or returns its value.
template <typename F>
auto Unlocked(F f) {
  decltype(f()) result = [&] {
    py::gil_scoped_release release;
    return f();
  }();
  ThrowIfError(result.status());
  return *std::move(result);
}

}  // namespace

void BindDecision(py::module_& m) {
  m.def(
      "plan_json",
      [](const std::string& problem, const std::vector<std::string>& flags) {
        return Unlocked([&] { return PlanJson(problem, flags); });
      },
      py::arg("problem_json"), py::arg("flags"),
      "dynmo-plan: the decision for a JSON problem, as the JSON the tool prints.");
  m.def(
      "simulate_json",
      [](const std::vector<std::string>& flags, bool gantt) {
        return Unlocked([&] { return SimulateJson(flags, gantt); });
      },
      py::arg("flags"), py::arg("gantt") = false,
      "dynmo-sim, one iteration: (result JSON, Gantt chart SVG or None).");
  m.def(
      "replay_json",
      [](const std::vector<std::string>& flags) {
        return Unlocked([&] { return ReplayJson(flags); });
      },
      py::arg("flags"), "dynmo-sim --trace/--scenario: the replay's JSON.");
  m.def(
      "split_write",
      [](const std::string& format, const std::vector<int>& boundaries) {
        return Unlocked([&] { return SplitWrite(format, boundaries); });
      },
      py::arg("format"), py::arg("boundaries"),
      "Boundaries in a plan format (torchtitan, megatron, deepspeed), as JSON text.");
  m.def(
      "split_read",
      [](const std::string& format, const std::string& value_json, int num_layers,
         int num_stages) {
        return Unlocked([&] { return SplitRead(format, value_json, num_layers, num_stages); });
      },
      py::arg("format"), py::arg("value_json"), py::arg("num_layers") = -1,
      py::arg("num_stages") = -1,
      "The boundaries of a split given in a plan format as JSON text; -1 infers a count.");
}

}  // namespace dynmo::python
