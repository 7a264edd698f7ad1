// dynmo-bench-paper-scale: the six dynamic cases of the paper (§2.2) at the
// paper's scale, in the simulator: static, re-partition only, re-partition +
// release, re-partition + reshape, and the oracle, side by side on the same
// generated trace (elastic_replay.h). Prints one JSON document (one object
// per case) that bench/paper_scale.sh turns into the table and the plot of
// docs/benchmarks.md.
//
// The job: 48 layers on 24 stages x 30 replicas (720 GPUs); MoE and MoD on
// 16 stages x 8 replicas (128 GPUs). Every replica runs 2 x pp micro-batches
// per iteration (the global batch stays fixed when the grid changes). A
// device holds 1.5x what the static layout's fullest stage holds at
// iteration 0 (--device_headroom), so the dense model cannot run on much
// fewer stages, as in the paper's memory-bound runs, and a shorter pipeline
// fits only once the model has shrunk.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/elastic_replay.h"
#include "core/partition.h"
#include "core/scenario.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, cases, "pruning,freezing,sparse-attention,early-exit,moe,mod",
          "comma-separated scenarios");
ABSL_FLAG(int, iterations, 200, "records per trace (iterations)");
ABSL_FLAG(std::string, trigger, "every:10",
          "when to decide: every:N or on-change[:T] (costs smoothed up to N records, "
          "10 for on-change, cut at the newest step)");
ABSL_FLAG(double, allreduce_gbps, 50, "gradient all-reduce bus bandwidth per rank, GB/s");
ABSL_FLAG(double, allreduce_overlap, 0.5, "fraction of the all-reduce hidden by backward");
ABSL_FLAG(double, migration_gbps, 25, "layer migration and re-shape copy bandwidth, GB/s");
ABSL_FLAG(double, repack_tolerance, 0.02, "release: bottleneck within this of the optimum");
ABSL_FLAG(uint64_t, seed, 1, "scenario seed");
ABSL_FLAG(std::string, units, "blocks",
          "pipeline units: blocks, or halves (attention and MLP halves as layers)");
ABSL_FLAG(double, device_headroom, 1.5,
          "device memory as a multiple of the static layout's fullest stage at iteration 0");

namespace {

using namespace dynmo::core;

struct Scale {
  int pp;
  int dp;
};

Scale ScaleOf(Scenario s) {
  if (s == Scenario::kMoE || s == Scenario::kMoD) return {16, 8};
  return {24, 30};
}

// One line on stderr, and the exit status to return.
int Fail(int status, absl::string_view message) {
  std::fprintf(stderr, "dynmo-bench-paper-scale: %s\n", std::string(message).c_str());
  return status;
}

int Run() {
  const std::string units = absl::GetFlag(FLAGS_units);
  if (units != "blocks" && units != "halves") {
    return Fail(2, absl::StrCat("--units must be blocks or halves, got '", units, "'"));
  }
  absl::StatusOr<RebalanceTrigger> trigger = ParseTrigger(absl::GetFlag(FLAGS_trigger));
  if (!trigger.ok()) return Fail(2, absl::StrCat("--trigger: ", trigger.status().message()));
  const double headroom = absl::GetFlag(FLAGS_device_headroom);
  if (!(headroom >= 1)) return Fail(2, "--device_headroom must be >= 1");
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const std::string& name : std::vector<std::string>(
       absl::StrSplit(absl::GetFlag(FLAGS_cases), ',', absl::SkipEmpty()))) {
    absl::StatusOr<Scenario> scenario = ParseScenario(name);
    if (!scenario.ok()) return Fail(2, scenario.status().message());
    ScenarioConfig sc;
    sc.scenario = *scenario;
    sc.layers = 48;
    sc.iterations = absl::GetFlag(FLAGS_iterations);
    sc.seed = absl::GetFlag(FLAGS_seed);
    sc.split_blocks = units == "halves";
    const int trace_layers = sc.split_blocks ? 2 * sc.layers : sc.layers;
    absl::StatusOr<Trace> trace = GenerateScenario(sc);
    if (!trace.ok()) return Fail(1, trace.status().message());
    const Scale scale = ScaleOf(*scenario);
    ElasticReplayConfig c;
    c.pp = scale.pp;
    c.dp = scale.dp;
    c.spec.global_microbatches = 2 * scale.pp * scale.dp;
    c.spec.tokens_per_microbatch = 8192;  // 4 sequences of 2,048 tokens
    c.spec.data_parallel.allreduce_bandwidth_bytes_per_s =
        absl::GetFlag(FLAGS_allreduce_gbps) * 1e9;
    c.spec.data_parallel.overlap = absl::GetFlag(FLAGS_allreduce_overlap);
    c.spec.data_parallel.grad_bytes_per_param = 2;  // fp16 gradients
    c.spec.data_parallel.copy_bandwidth_bytes_per_s = absl::GetFlag(FLAGS_migration_gbps) * 1e9;
    c.migration_bandwidth_bytes_per_s = absl::GetFlag(FLAGS_migration_gbps) * 1e9;
    c.resident_bytes_per_param = sc.bytes_per_param;
    c.trigger = *trigger;
    if (c.trigger.kind != RebalanceTrigger::Kind::kEvery) c.smoothing_window = 10;
    c.repack_tolerance = absl::GetFlag(FLAGS_repack_tolerance);
    // The device: the static layout's fullest stage at iteration 0 times the
    // headroom (1.5: a stage of two dense blocks can take a third).
    const Boundaries b = PartitionUniform(trace_layers, scale.pp);
    int64_t fullest = 0;
    for (int s = 0; s < scale.pp; ++s) {
      int64_t bytes = 0;
      for (int l = b[s]; l < b[s + 1]; ++l) bytes += trace->front().layers[l].mem_bytes;
      fullest = std::max(fullest, bytes);
    }
    c.spec.device.capacity_bytes = static_cast<int64_t>(static_cast<double>(fullest) * headroom);

    absl::StatusOr<std::vector<ModeResult>> r = ReplayElastic(*trace, c);
    if (!r.ok()) return Fail(1, absl::StrCat(name, ": ", r.status().message()));
    nlohmann::ordered_json row;
    row["case"] = name;
    row["units"] = units;
    row["trigger"] = absl::GetFlag(FLAGS_trigger);
    row["pp"] = scale.pp;
    row["dp"] = scale.dp;
    row["gpus"] = scale.pp * scale.dp;
    row["device_bytes"] = c.spec.device.capacity_bytes;
    const ModeResult& fixed = r->front();
    for (const ModeResult& m : *r) {
      nlohmann::ordered_json j;
      j["tokens_per_s"] = m.tokens_per_s;
      j["speedup"] = m.tokens_per_s / fixed.tokens_per_s;
      j["final_tokens_per_s"] = m.final_tokens_per_s;
      j["final_speedup"] = m.final_tokens_per_s / fixed.final_tokens_per_s;
      j["mean_gpus"] = m.mean_gpus;
      j["gpu_hours_vs_static"] = m.gpu_seconds / fixed.gpu_seconds;
      j["migration_s"] = m.migration_s;
      j["changes"] = m.changes;
      j["final_grid"] = std::to_string(m.final_grid.pp) + "x" + std::to_string(m.final_grid.dp);
      nlohmann::ordered_json events = nlohmann::ordered_json::array();
      for (const ElasticEvent& e : m.events) {
        events.push_back(std::to_string(e.iter) + ": " + e.what);
      }
      j["events"] = events;
      row[ElasticModeName(m.mode)] = j;
    }
    out.push_back(row);
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "the six dynamic cases at the paper's scale in the simulator: static, "
      "re-partition, release, reshape and the oracle (JSON on stdout)");
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    return Fail(2, absl::StrCat("unexpected argument '", rest[1], "'"));
  }
  return Run();
}
