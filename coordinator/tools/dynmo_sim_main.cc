// dynmo-sim: the pipeline simulator and the trace replay on the command line.
//
// One iteration of a schedule, printed as
// {"iteration_time":..,"bubble_ratio":..,"stage_idle":[..]}:
//
//   dynmo-sim --schedule {gpipe,1f1b,zb-h1} --microbatches M
//             (--stages P --fwd F --bwd B --wgrad W | --stage-times F:B:W,...)
//             [--comm C] [--svg FILE] [--perfetto FILE]
//
// A dynamic model's trace replayed static against dynamic through the
// coordinator's own job machine (coordinator/job/job_replay.h), from a JSON
// Lines file (formats/trace_json.h) or a generated scenario (scenario.h):
//
//   dynmo-sim (--trace FILE | --scenario NAME) --stages P
//             [--schedule S] [--microbatches M] [--balancer METHOD]
//             [--trigger auto|every:N|on-event|manual|on-change[:T]]
//             [--dp D] [--elastic none|release|reshape] [--repack-tolerance T]
//             [--bandwidth BYTES_PER_S] [--capacity BYTES] [--oracle]
//             [--straggler RANK:SPEED[:FROM[:TO]],...]
//             [--iterations K] [--seed S] [--units blocks|halves] [--layers L]
//             [--write-trace FILE]
//
// Every usage or input error prints one line on stderr and exits with 2; a
// file that cannot be written exits with 1. The flags and the computation
// are sim_command.h (shared with the Python binding); this file prints and
// writes the --svg and --write-trace files.
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cli/program_info.h"
#include "core/pipeline_sim.h"
#include "formats/trace_json.h"
#include "coordinator/tools/cli_args.h"
#include "coordinator/tools/sim_command.h"

namespace {

using dynmo::tools::CliArgs;
using dynmo::tools::FailUsage;
namespace core = dynmo::core;
namespace formats = dynmo::formats;

constexpr char kTool[] = "dynmo-sim";
constexpr int kWriteFailureExit = 1;

constexpr char kUsage[] =
    "usage: dynmo-sim --schedule {gpipe,1f1b,zb-h1} --microbatches M\n"
    "                 (--stages P --fwd F --bwd B --wgrad W |"
    " --stage-times F:B:W,...)\n"
    "                 [--comm C] [--svg FILE] [--perfetto FILE]\n"
    "       dynmo-sim (--trace FILE | --scenario NAME) --stages P\n"
    "                 [--schedule S] [--microbatches M] [--balancer METHOD]\n"
    "                 [--trigger auto|every:N|on-event|manual|on-change[:T]]\n"
    "                 [--dp D] [--elastic none|release|reshape]"
    " [--repack-tolerance T]\n"
    "                 [--bandwidth BYTES_PER_S] [--capacity BYTES] [--oracle]\n"
    "                 [--straggler RANK:SPEED[:FROM[:TO]],...] [--perfetto FILE]\n"
    "                 [--iterations K] [--seed S] [--units blocks|halves]\n"
    "                 [--layers L] [--write-trace FILE]\n"
    "\n"
    "A replay decides with the coordinator's own job machine (the daemon's\n"
    "smoothed costs, noise tracker, trigger, payback gate, cool-down, plan\n"
    "lead, re-packing and re-shaping): --trigger defaults to auto, the\n"
    "coordinator's default. --dp replicas per stage; --elastic release packs\n"
    "layers onto fewer stages and hands the rest back (GPU-hours fall),\n"
    "reshape re-groups the same ranks into pp' x dp'; --repack-tolerance the\n"
    "bottleneck loss a re-pack may cost (default 0.02). --oracle adds each\n"
    "iteration on its own optimum, moved for free: re-partitioning's ceiling.\n"
    "--straggler 3:0.5:100:300 runs rank 3 at half speed over iterations\n"
    "[100, 300): its layers and speed probe take twice as long, and the\n"
    "coordinator must find it from the probes, as it would live.\n"
    "on-change[:T] runs the trace-only replay instead (not the daemon's rule).\n"
    "--perfetto FILE writes a chrome trace-event JSON that ui.perfetto.dev opens:\n"
    "a simulated iteration with a track per stage and PyTorch's PP:<stage><F|B|W><mb>\n"
    "action names, or a replay's static and DynMo iterations with every plan.\n"
    "--layers L repeats or scales a recorded trace to L layers; a scenario's\n"
    "--units halves makes each block's attention and MLP two pipeline units.\n"
    "scenarios: pruning freezing sparse-attention early-exit moe mod\n";

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  return static_cast<bool>(out);
}

int RunSimulation(const CliArgs& args) {
  absl::StatusOr<dynmo::tools::SimRun> run = dynmo::tools::SimulateCommand(args);
  if (!run.ok()) return FailUsage(kTool, run.status().message());
  if (std::optional<std::string> svg = args.Get("svg")) {
    if (!WriteFile(*svg, core::RenderGanttSvg(run->result, run->title))) {
      std::cerr << kTool << ": cannot write '" << *svg << "'\n";
      return kWriteFailureExit;
    }
  }
  if (std::optional<std::string> path = args.Get("perfetto")) {
    if (!WriteFile(*path, run->perfetto.dump())) {
      std::cerr << kTool << ": cannot write '" << *path << "'\n";
      return kWriteFailureExit;
    }
  }
  std::cout << run->json.dump() << "\n";
  return 0;
}

int RunReplay(const CliArgs& args) {
  absl::StatusOr<dynmo::tools::ReplayRun> run = dynmo::tools::ReplayCommand(args);
  if (!run.ok()) return FailUsage(kTool, run.status().message());
  if (std::optional<std::string> path = args.Get("perfetto")) {
    if (run->perfetto.is_null()) {
      return FailUsage(kTool, "--perfetto needs one of the coordinator's triggers, not on-change");
    }
    if (!WriteFile(*path, run->perfetto.dump())) {
      std::cerr << kTool << ": cannot write '" << *path << "'\n";
      return kWriteFailureExit;
    }
  }
  if (std::optional<std::string> out = args.Get("write-trace")) {
    if (!WriteFile(*out, formats::TraceToJsonl(run->trace))) {
      std::cerr << kTool << ": cannot write '" << *out << "'\n";
      return kWriteFailureExit;
    }
  }
  std::cout << run->json.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (dynmo::cli::HandleHelpOrVersion(argc, argv, "dynmo-sim", kUsage)) return 0;
  absl::StatusOr<CliArgs> args =
      CliArgs::Parse(argc, argv, dynmo::tools::SimValueFlags(), [] {
        std::set<std::string> bools = dynmo::tools::SimBoolFlags();
        bools.insert("help");
        return bools;
      }());
  if (!args.ok()) return FailUsage(kTool, args.status().message());
  if (args->Has("help")) {
    std::cout << kUsage;
    return 0;
  }
  if (!args->positional().empty()) {
    return FailUsage(
        kTool, absl::StrCat("unexpected argument '", args->positional().front(),
                            "' (see --help)"));
  }
  if (dynmo::tools::IsReplay(*args)) return RunReplay(*args);
  return RunSimulation(*args);
}
