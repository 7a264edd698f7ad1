#include "coordinator/tools/sim_command.h"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/partition.h"
#include "core/reshape.h"
#include "core/stage_program.h"
#include "core/rebalance_trigger.h"
#include "core/scenario.h"
#include "core/trace_depth.h"
#include "formats/chrome_trace.h"
#include "formats/sim_json.h"
#include "formats/trace_json.h"
#include "coordinator/job/job_replay.h"
#include "coordinator/job/policy.h"
#include "coordinator/tools/replay_json.h"

namespace dynmo::tools {
namespace {

namespace formats = dynmo::formats;

// Flags that only one mode reads; giving one to the other mode is an error
// rather than silently ignored.
const std::vector<std::string> kSimulationOnly = {
    "fwd", "bwd", "wgrad", "stage-times", "comm", "svg"};  // --perfetto: both
const std::vector<std::string> kReplayOnly = {
    "balancer", "trigger", "bandwidth", "capacity",         "iterations", "seed",
    "layers",   "write-trace", "dp",    "elastic", "repack-tolerance", "oracle", "units",
    "straggler"};
// Flags the coordinator's engine reads and the trace-only on-change replay
// does not.
const std::vector<std::string> kCoordinatorOnly = {"dp", "elastic", "repack-tolerance",
                                                   "straggler"};
const std::vector<std::string> kScenarioOnly = {"iterations", "seed", "units"};

absl::Status Usage(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

absl::Status RejectFlags(const CliArgs& args,
                         const std::vector<std::string>& flags,
                         absl::string_view why) {
  for (const std::string& f : flags) {
    if (args.Has(f)) return Usage(absl::StrCat("--", f, " ", why));
  }
  return absl::OkStatus();
}

// A flag that must be a number >= 0 (finite: CliArgs checks that).
absl::StatusOr<std::optional<double>> NonNegative(const CliArgs& args,
                                                  absl::string_view name) {
  absl::StatusOr<std::optional<double>> v = args.GetDouble(name);
  if (!v.ok()) return v.status();
  if (*v && **v < 0) {
    return Usage(absl::StrCat("--", name, " must be >= 0, got ", **v));
  }
  return v;
}

// A flag that must be an integer >= 1.
absl::StatusOr<std::optional<int>> Positive(const CliArgs& args,
                                            absl::string_view name) {
  absl::StatusOr<std::optional<int>> v = args.GetInt(name);
  if (!v.ok()) return v.status();
  if (*v && **v < 1) {
    return Usage(absl::StrCat("--", name, " must be >= 1, got ", **v));
  }
  return v;
}

absl::StatusOr<std::vector<core::StagePassTimes>> ParseStageTimes(
    absl::string_view text) {
  std::vector<core::StagePassTimes> stages;
  for (absl::string_view stage : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> parts = absl::StrSplit(stage, ':');
    double t[3];
    bool ok = parts.size() == 3;
    for (size_t i = 0; ok && i < 3; ++i) {
      ok =
          absl::SimpleAtod(parts[i], &t[i]) && std::isfinite(t[i]) && t[i] >= 0;
    }
    if (!ok) {
      return Usage(absl::StrCat("--stage-times entry '", stage, "' of stage ",
                                stages.size(),
                                " wants F:B:W with three numbers >= 0"));
    }
    stages.push_back({t[0], t[1], t[2]});
  }
  return stages;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Usage(absl::StrCat("cannot read '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The trace to replay, from --trace or --scenario, and a name for it.
absl::StatusOr<core::Trace> LoadTrace(const CliArgs& args,
                                      std::string* source) {
  if (args.Has("trace") == args.Has("scenario")) {
    return Usage("give exactly one of --trace FILE and --scenario NAME");
  }
  if (std::optional<std::string> path = args.Get("trace")) {
    if (absl::Status s =
            RejectFlags(args, kScenarioOnly, "only applies with --scenario");
        !s.ok()) {
      return s;
    }
    absl::StatusOr<std::string> text = ReadFile(*path);
    if (!text.ok()) return text.status();
    absl::StatusOr<core::Trace> trace = formats::ParseTraceJsonl(*text);
    if (!trace.ok()) {
      return Usage(absl::StrCat(*path, ": ", trace.status().message()));
    }
    *source = absl::StrCat("trace:", *path);
    // --layers stretches a recorded trace by depth (core/trace_depth.h).
    absl::StatusOr<std::optional<int>> layers = Positive(args, "layers");
    if (!layers.ok()) return layers.status();
    if (!*layers) return trace;
    absl::StatusOr<core::Trace> stretched = core::ResampleTraceDepth(*trace, **layers);
    if (!stretched.ok()) {
      return Usage(absl::StrCat("--layers: ", stretched.status().message()));
    }
    return stretched;
  }
  core::ScenarioConfig scenario;
  absl::StatusOr<core::Scenario> name =
      core::ParseScenario(*args.Get("scenario"));
  if (!name.ok()) return name.status();
  scenario.scenario = *name;
  absl::StatusOr<std::optional<int>> iterations = Positive(args, "iterations");
  if (!iterations.ok()) return iterations.status();
  scenario.iterations = iterations->value_or(scenario.iterations);
  absl::StatusOr<std::optional<int>> layers = Positive(args, "layers");
  if (!layers.ok()) return layers.status();
  scenario.layers = layers->value_or(scenario.layers);
  if (std::optional<std::string> seed = args.Get("seed")) {
    if (!absl::SimpleAtoi(*seed, &scenario.seed)) {
      return Usage(absl::StrCat(
          "--seed wants an unsigned 64-bit integer, got '", *seed, "'"));
    }
  }
  if (std::optional<std::string> units = args.Get("units")) {
    if (*units != "blocks" && *units != "halves") {
      return Usage(absl::StrCat("--units wants blocks or halves, got '", *units, "'"));
    }
    // Halves: each block's attention and MLP become two pipeline units.
    scenario.split_blocks = *units == "halves";
  }
  *source = absl::StrCat("scenario:", core::ScenarioName(scenario.scenario));
  return core::GenerateScenario(scenario);
}

absl::StatusOr<core::SimConfig> SimConfigFrom(const CliArgs& args) {
  if (absl::Status s = RejectFlags(args, kReplayOnly,
                                   "only applies with --trace or --scenario");
      !s.ok()) {
    return s;
  }
  core::SimConfig config;
  std::optional<std::string> schedule = args.Get("schedule");
  if (!schedule) return Usage("--schedule is required (gpipe, 1f1b or zb-h1)");
  absl::StatusOr<core::Schedule> parsed = core::ParseSchedule(*schedule);
  if (!parsed.ok()) return parsed.status();
  config.schedule = *parsed;

  absl::StatusOr<std::optional<int>> m = Positive(args, "microbatches");
  if (!m.ok()) return m.status();
  if (!*m) return Usage("--microbatches is required");
  config.microbatches = **m;

  const bool uniform = args.Has("stages") || args.Has("fwd") ||
                       args.Has("bwd") || args.Has("wgrad");
  if (args.Has("stage-times")) {
    if (uniform) {
      return Usage(
          "give either --stage-times or --stages/--fwd/--bwd/--wgrad, not "
          "both");
    }
    absl::StatusOr<std::vector<core::StagePassTimes>> stages =
        ParseStageTimes(*args.Get("stage-times"));
    if (!stages.ok()) return stages.status();
    config.stages = *std::move(stages);
  } else {
    for (const char* f : {"stages", "fwd", "bwd", "wgrad"}) {
      if (!args.Has(f)) {
        return Usage(absl::StrCat(
            "--", f, " is required (or give --stage-times F:B:W,... instead)"));
      }
    }
    absl::StatusOr<std::optional<int>> p = Positive(args, "stages");
    if (!p.ok()) return p.status();
    core::StagePassTimes times;
    for (auto [name, field] :
         {std::pair{"fwd", &times.fwd_s}, std::pair{"bwd", &times.bwd_s},
          std::pair{"wgrad", &times.wgrad_s}}) {
      absl::StatusOr<std::optional<double>> t = NonNegative(args, name);
      if (!t.ok()) return t.status();
      *field = **t;
    }
    config.stages.assign(**p, times);
  }
  absl::StatusOr<std::optional<double>> comm = NonNegative(args, "comm");
  if (!comm.ok()) return comm.status();
  config.transfer_s = comm->value_or(0);
  return config;
}


absl::StatusOr<core::ReplayConfig> ReplayConfigFrom(const CliArgs& args) {
  if (absl::Status s = RejectFlags(args, kSimulationOnly,
                                   "does not apply with --trace or --scenario");
      !s.ok()) {
    return s;
  }
  core::ReplayConfig config;
  absl::StatusOr<std::optional<int>> p = Positive(args, "stages");
  if (!p.ok()) return p.status();
  if (!*p) return Usage("--stages is required");
  config.stages = **p;
  if (std::optional<std::string> schedule = args.Get("schedule")) {
    absl::StatusOr<core::Schedule> parsed = core::ParseSchedule(*schedule);
    if (!parsed.ok()) return parsed.status();
    config.schedule = *parsed;
  }
  // Four micro-batches per stage keeps the fill-and-drain bubble modest.
  absl::StatusOr<std::optional<int>> m = Positive(args, "microbatches");
  if (!m.ok()) return m.status();
  config.microbatches = m->value_or(4 * config.stages);
  if (std::optional<std::string> balancer = args.Get("balancer")) {
    absl::StatusOr<core::PartitionMethod> parsed =
        core::ParsePartitionMethod(*balancer);
    if (!parsed.ok()) return parsed.status();
    config.balancer = *parsed;
  }
  // The coordinator's default trigger unless told otherwise.
  config.trigger = core::RebalanceTrigger{core::RebalanceTrigger::Kind::kAuto};
  if (std::optional<std::string> trigger = args.Get("trigger")) {
    absl::StatusOr<core::RebalanceTrigger> parsed =
        core::ParseTrigger(*trigger);
    if (!parsed.ok()) return parsed.status();
    if (absl::Status s = core::ValidateTrigger(*parsed); !s.ok()) return s;
    config.trigger = *parsed;
  }
  absl::StatusOr<std::optional<double>> bandwidth =
      NonNegative(args, "bandwidth");
  if (!bandwidth.ok()) return bandwidth.status();
  config.migration_bandwidth_bytes_per_s = bandwidth->value_or(0);
  absl::StatusOr<std::optional<double>> capacity =
      NonNegative(args, "capacity");
  if (!capacity.ok()) return capacity.status();
  if (*capacity) {
    if (**capacity > 9.0e18 || **capacity != std::floor(**capacity)) {
      return Usage(
          absl::StrCat("--capacity wants a whole number of bytes, got ",
                       *args.Get("capacity")));
    }
    config.stage_capacity_bytes = static_cast<int64_t>(**capacity);
  }
  return config;
}


// What the coordinator's engine reads beyond the replay's common flags.
struct CoordinatorFlags {
  int dp = 1;
  std::string elastic = "none";  // none | release | reshape
  double repack_tolerance = 0.02;
  bool oracle = false;
  std::vector<service::SpeedChange> stragglers;
};

// --straggler RANK:SPEED[:FROM[:TO]],... (global ranks; iterations).
absl::StatusOr<std::vector<service::SpeedChange>> ParseStragglers(absl::string_view text) {
  std::vector<service::SpeedChange> out;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> parts = absl::StrSplit(item, ':');
    service::SpeedChange c;
    bool ok = parts.size() >= 2 && parts.size() <= 4 && absl::SimpleAtoi(parts[0], &c.rank) &&
              absl::SimpleAtod(parts[1], &c.speed) && std::isfinite(c.speed);
    if (ok && parts.size() >= 3) ok = absl::SimpleAtoi(parts[2], &c.from_iteration);
    if (ok && parts.size() == 4) ok = absl::SimpleAtoi(parts[3], &c.to_iteration);
    if (!ok) {
      return Usage(absl::StrCat("--straggler entry '", item,
                                "' wants RANK:SPEED[:FROM[:TO]] (e.g. 3:0.5:100:300)"));
    }
    out.push_back(c);
  }
  return out;
}

absl::StatusOr<CoordinatorFlags> CoordinatorFlagsFrom(const CliArgs& args) {
  CoordinatorFlags f;
  absl::StatusOr<std::optional<int>> dp = Positive(args, "dp");
  if (!dp.ok()) return dp.status();
  f.dp = dp->value_or(1);
  if (std::optional<std::string> e = args.Get("elastic")) {
    if (*e != "none" && *e != "release" && *e != "reshape") {
      return Usage(absl::StrCat("--elastic wants none, release or reshape, got '", *e, "'"));
    }
    f.elastic = *e;
  }
  absl::StatusOr<std::optional<double>> tol = NonNegative(args, "repack-tolerance");
  if (!tol.ok()) return tol.status();
  if (*tol && f.elastic == "none") {
    return Usage("--repack-tolerance needs --elastic release or reshape");
  }
  f.repack_tolerance = tol->value_or(f.repack_tolerance);
  f.oracle = args.Has("oracle");
  if (std::optional<std::string> text = args.Get("straggler")) {
    absl::StatusOr<std::vector<service::SpeedChange>> st = ParseStragglers(*text);
    if (!st.ok()) return st.status();
    f.stragglers = *std::move(st);
  }
  return f;
}

// The coordinator's defaults (service::JobOptions) with the flags' policy.
service::JobReplayConfig JobReplayConfigOf(const core::ReplayConfig& c,
                                           const CoordinatorFlags& f) {
  service::JobReplayConfig job;
  job.pp = c.stages;
  job.dp = f.dp;
  job.microbatches = c.microbatches;
  job.schedule = core::ScheduleName(c.schedule);
  job.stage_capacity_bytes = c.stage_capacity_bytes;
  job.migration_bandwidth_bytes_per_s = c.migration_bandwidth_bytes_per_s;
  service::Policy& policy = job.options.default_policy;
  policy.balancer = c.balancer;
  policy.trigger = c.trigger;
  policy.repack = f.elastic != "none";
  policy.repack_tolerance = f.repack_tolerance;
  policy.elastic = f.elastic == "reshape" ? service::Elastic::kReshape
                                          : service::Elastic::kRelease;
  job.stragglers = f.stragglers;
  job.oracle = f.oracle;
  // The auto gate prices a migration at the link the replay charges it at.
  if (c.migration_bandwidth_bytes_per_s > 0) {
    job.options.auto_options.bandwidth_bytes_per_s = c.migration_bandwidth_bytes_per_s;
  }
  return job;
}

}  // namespace

const std::set<std::string>& SimValueFlags() {
  static const auto* flags = new std::set<std::string>{
      "schedule",  "microbatches", "stages",  "fwd",        "bwd",
      "wgrad",     "stage-times",  "comm",    "svg",        "trace",
      "scenario",  "balancer",     "trigger", "iterations", "seed",
      "bandwidth", "capacity",     "layers",  "write-trace", "dp",
      "elastic",   "repack-tolerance", "units", "straggler", "perfetto"};
  return *flags;
}

const std::set<std::string>& SimBoolFlags() {
  static const auto* flags = new std::set<std::string>{"oracle"};
  return *flags;
}

bool IsReplay(const CliArgs& args) {
  return args.Has("trace") || args.Has("scenario");
}

absl::StatusOr<SimRun> SimulateCommand(const CliArgs& args) {
  SimRun run;
  absl::StatusOr<core::SimConfig> config = SimConfigFrom(args);
  if (!config.ok()) return config.status();
  run.config = *std::move(config);
  absl::StatusOr<core::SimResult> result = core::SimulatePipeline(run.config);
  if (!result.ok()) return Usage(result.status().message());
  run.result = *std::move(result);
  run.json = formats::SimResultToJson(run.result);
  run.title = absl::StrCat(core::ScheduleName(run.config.schedule), ", ",
                           run.config.stages.size(), " stages, ",
                           run.config.microbatches, " micro-batches");
  run.perfetto = formats::SimResultToChromeTrace(run.result, run.title);
  return run;
}

absl::StatusOr<ReplayRun> ReplayCommand(const CliArgs& args) {
  ReplayRun run;
  absl::StatusOr<core::ReplayConfig> config = ReplayConfigFrom(args);
  if (!config.ok()) return config.status();
  const bool on_change = config->trigger.kind == core::RebalanceTrigger::Kind::kOnChange;
  if (on_change) {
    if (absl::Status s = RejectFlags(args, kCoordinatorOnly,
                                     "needs one of the coordinator's triggers (every:N, "
                                     "on-event, auto, manual), not on-change");
        !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<CoordinatorFlags> coordinator = CoordinatorFlagsFrom(args);
  if (!coordinator.ok()) return coordinator.status();
  std::string source;
  absl::StatusOr<core::Trace> trace = LoadTrace(args, &source);
  if (!trace.ok()) return Usage(trace.status().message());
  run.trace = *std::move(trace);
  run.json["source"] = source;
  run.json["layers"] = run.trace.front().layers.size();
  if (on_change) {
    // The trace-only replay (core/replay.h): not the daemon's rules.
    absl::StatusOr<core::ReplayResult> result = core::ReplayTrace(run.trace, *config);
    if (!result.ok()) return Usage(result.status().message());
    run.json["engine"] = "trace";
    const nlohmann::ordered_json replay = formats::ReplayResultToJson(*result, *config);
    for (const auto& [key, value] : replay.items()) run.json[key] = value;
  } else {
    const service::JobReplayConfig job = JobReplayConfigOf(*config, *coordinator);
    absl::StatusOr<service::JobReplayResult> result = service::ReplayJob(run.trace, job);
    if (!result.ok()) return Usage(result.status().message());
    run.json["engine"] = "coordinator";
    const nlohmann::ordered_json replay = JobReplayToJson(*result, job, coordinator->elastic,
                                                            coordinator->repack_tolerance,
                                                            coordinator->oracle);
    for (const auto& [key, value] : replay.items()) run.json[key] = value;
    run.perfetto = ReplayTimeline(*result, source);
  }
  if (coordinator->oracle && on_change) {
    absl::StatusOr<nlohmann::ordered_json> oracle =
        OracleJson(run.trace, *config, coordinator->dp,
                   run.json["static_total_s"].get<double>());
    if (!oracle.ok()) return Usage(oracle.status().message());
    run.json["oracle"] = *oracle;
  }
  return run;
}

}  // namespace dynmo::tools
