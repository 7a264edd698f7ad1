#include "clients/loadgen_trace.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/measures.h"
#include "core/scenario.h"
#include "formats/trace_json.h"

namespace dynmo::clients {

absl::StatusOr<core::Trace> LoadgenTrace(const LoadgenTraceSource& source) {
  if (source.scenario.empty() == source.trace_file.empty()) {
    return absl::InvalidArgumentError("give exactly one of --scenario and --trace");
  }
  core::Trace trace;
  if (!source.scenario.empty()) {
    absl::StatusOr<core::Scenario> sc = core::ParseScenario(source.scenario);
    if (!sc.ok()) return sc.status();
    core::ScenarioConfig cfg;
    cfg.scenario = *sc;
    cfg.layers = source.layers > 0 ? source.layers : std::max(48, 2 * source.stages);
    cfg.iterations = std::max(source.iterations, 2);
    cfg.seed = source.seed;
    absl::StatusOr<core::Trace> t = core::GenerateScenario(cfg);
    if (!t.ok()) return t.status();
    trace = *std::move(t);
  } else {
    std::ifstream in(source.trace_file);
    if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", source.trace_file));
    std::stringstream buf;
    buf << in.rdbuf();
    absl::StatusOr<core::Trace> t = formats::ParseTraceJsonl(buf.str());
    if (!t.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source.trace_file, ": ", t.status().message()));
    }
    trace = *std::move(t);
  }
  const int num_layers = static_cast<int>(trace.front().layers.size());
  if (num_layers < source.stages) {
    return absl::InvalidArgumentError(absl::StrCat("the trace has ", num_layers,
                                                   " layers for ", source.stages, " stages"));
  }
  return trace;
}

double ImbalanceOf(const core::TraceRecord& record, const std::vector<int>& boundaries) {
  core::PipelineModel model;
  model.layers = core::LayerCostsOf(record);
  model.stages.assign(boundaries.size() - 1, core::StageSpec{});
  return core::Imbalance(core::StageLoads(model, boundaries));
}

}  // namespace dynmo::clients
