#include "coordinator/tools/replay_json.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/partition.h"
#include "core/realized_gain.h"
#include "core/reshape.h"
#include "core/stage_program.h"
#include "formats/chrome_trace.h"
#include "coordinator/job/policy.h"
#include "coordinator/job/replay_bounds.h"

namespace dynmo::tools {

namespace formats = dynmo::formats;

nlohmann::ordered_json JobReplayToJson(const service::JobReplayResult& r,
                                       const service::JobReplayConfig& c,
                                       const std::string& elastic, double repack_tolerance,
                                       bool oracle) {
  nlohmann::ordered_json j;
  const service::Policy& policy = c.options.default_policy;
  j["stages"] = c.pp;
  j["dp"] = c.dp;
  j["schedule"] = c.schedule;
  j["microbatches"] = c.microbatches;
  j["balancer"] = core::PartitionMethodName(policy.balancer);
  j["trigger"] = core::TriggerName(policy.trigger);
  j["elastic"] = elastic;
  if (elastic != "none") j["repack_tolerance"] = repack_tolerance;
  j["plan_lead_iterations"] = c.options.plan_lead_iterations;
  j["migration_bandwidth"] = c.migration_bandwidth_bytes_per_s;
  if (!c.stragglers.empty()) {
    nlohmann::ordered_json st = nlohmann::ordered_json::array();
    for (const service::SpeedChange& x : c.stragglers) {
      st.push_back({{"rank", x.rank}, {"speed", x.speed}, {"from", x.from_iteration},
                    {"to", x.to_iteration}});
    }
    j["stragglers"] = st;
  }
  j["iterations"] = r.iterations;
  j["static_total_s"] = r.static_total_s;
  j["dynamic_total_s"] = r.dynamic_total_s;
  j["speedup"] = r.speedup;
  // The last tenth of the run, where a pruned or frozen model has shrunk
  // the most.
  const int tail = service::TailStart(r.iterations, 0.1);
  double static_tail = 0, dynamic_tail = 0;
  for (size_t i = static_cast<size_t>(tail); i < r.static_iteration_s.size(); ++i) {
    static_tail += r.static_iteration_s[i];
    dynamic_tail += r.dynamic_iteration_s[i];
  }
  j["last_tenth_speedup"] = dynamic_tail > 0 ? static_tail / dynamic_tail : 1.0;
  if (oracle) {
    j["oracle"] = {{"what", "re-partition ceiling: each iteration on its own optimum over "
                            "the starting grid at the ranks' true speeds, moved for free"},
                   {"total_s", r.oracle_total_s},
                   {"speedup", r.oracle_speedup},
                   {"delayed", {{"what", "each iteration on the optimum of the iteration "
                                         "one plan lead earlier, moved for free"},
                                {"lead_iterations", c.options.plan_lead_iterations},
                                {"total_s", r.delayed_oracle_total_s},
                                {"speedup", r.delayed_oracle_speedup}}}};
    if (r.release_bound) {
      j["oracle"]["release"] = {
          {"what", "the fewest GPU-hours any release schedule spends at >= 98% of "
                   "static's tokens/s (a Lagrangian lower bound)"},
          {"min_gpu_hours", r.release_bound->min_gpu_s / 3600},
          {"fraction_of_static", r.release_bound->fraction}};
    }
    if (r.reshape_bound) {
      j["oracle"]["reshape"] = {
          {"what", "each iteration on its fastest grid of the same ranks, copies free"},
          {"speedup", r.reshape_bound->speedup},
          {"last_tenth_speedup", r.reshape_bound->tail_speedup}};
    }
  }
  j["gpu_hours"] = {{"static", r.static_gpu_s / 3600}, {"dynamic", r.dynamic_gpu_s / 3600}};
  int applied = 0;
  int64_t moved = 0;
  std::vector<int64_t> applied_at;
  nlohmann::ordered_json plans = nlohmann::ordered_json::array();
  std::vector<double> errors;
  for (const service::ReplayedPlan& p : r.plans) {
    if (p.outcome == "applied") {
      ++applied;
      moved += p.migration_bytes;
      applied_at.push_back(p.apply_iteration);
    }
    plans.push_back({{"epoch", p.epoch},
                     {"decided_iteration", p.decided_iteration},
                     {"apply_iteration", p.apply_iteration},
                     {"reason", p.reason},
                     {"outcome", p.outcome},
                     {"grid", absl::StrCat(p.pp, "x", p.dp)},
                     {"stages", p.active_stages},
                     {"boundaries", p.boundaries},
                     {"migration_bytes", p.migration_bytes},
                     {"predicted_gain", p.predicted_gain},
                     {"realized_gain", p.realized_samples > 0
                                           ? nlohmann::ordered_json(p.realized_gain)
                                           : nlohmann::ordered_json(nullptr)},
                     {"realized_spread", p.realized_spread},
                     {"realized_samples", p.realized_samples},
                     {"realized_model_changed", p.realized_model_changed}});
    if (p.realized_samples > 0 && !p.realized_model_changed) {
      errors.push_back(std::abs(p.predicted_gain - p.realized_gain));
    }
  }
  // The median |predicted - realized| over the plans measured across no
  // model change (points of gain); null when none was.
  j["median_prediction_error"] =
      errors.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(core::Median(errors));
  j["decisions"] = r.plans.size();  // plans issued
  j["rebalances"] = applied;         // plans applied
  j["moved_bytes"] = moved;
  j["migration_s"] = r.migration_s;
  j["mean_imbalance"] = {{"static", r.mean_imbalance_static},
                         {"dynamic", r.mean_imbalance_dynamic}};
  j["mean_bubble_ratio"] = {{"static", r.mean_bubble_static},
                            {"dynamic", r.mean_bubble_dynamic}};
  j["static_boundaries"] = core::PartitionUniform(
      static_cast<int>(r.final_boundaries.empty() ? 0 : r.final_boundaries.back()), c.pp);
  j["final_boundaries"] = r.final_boundaries;
  j["final_grid"] = absl::StrCat(r.final_pp, "x", r.final_dp);
  j["final_stages"] = r.final_active_stages;
  j["rebalance_iters"] = applied_at;
  j["plans"] = plans;
  return j;
}

// Static, DynMo (and the oracle, when asked) iteration by iteration, each
// plan decided and applied as an instant event on the DynMo track.
nlohmann::ordered_json ReplayTimeline(const service::JobReplayResult& r,
                                      const std::string& source) {
  std::vector<formats::TimelineTrack> tracks(r.oracle_iteration_s.empty() ? 2 : 3);
  tracks[0].name = "static";
  tracks[1].name = "DynMo";
  for (formats::TimelineTrack& t : tracks) t.iterations = r.record_iterations;
  tracks[0].seconds = r.static_iteration_s;
  tracks[1].seconds = r.dynamic_iteration_s;
  if (tracks.size() == 3) {
    tracks[2].name = "oracle (free moves)";
    tracks[2].seconds = r.oracle_iteration_s;
  }
  std::vector<formats::TimelineMark> marks;
  for (const service::ReplayedPlan& p : r.plans) {
    std::map<std::string, std::string> args = {
        {"reason", p.reason},
        {"grid", absl::StrCat(p.pp, "x", p.dp)},
        {"boundaries", absl::StrJoin(p.boundaries, ",")},
        {"migration_bytes", absl::StrCat(p.migration_bytes)},
        {"outcome", p.outcome},
        {"predicted_gain", absl::StrFormat("%+.1f%%", 100 * p.predicted_gain)},
        {"realized_gain", p.realized_samples > 0
                              ? absl::StrFormat("%+.1f%% (spread %.1f%%, %d iterations%s)",
                                                100 * p.realized_gain, 100 * p.realized_spread,
                                                p.realized_samples,
                                                p.realized_model_changed
                                                    ? ", the model changed inside"
                                                    : "")
                              : std::string("not measured")}};
    marks.push_back({"DynMo", p.decided_iteration,
                     absl::StrCat("plan ", p.epoch, " decided"), args});
    if (p.outcome == "applied") {
      marks.push_back({"DynMo", p.apply_iteration, absl::StrCat("plan ", p.epoch, " applied"),
                       args});
    }
  }
  return formats::TimelineToChromeTrace(tracks, marks, absl::StrCat("dynmo-sim ", source));
}

// Each record on its own exact optimum over pp stages (x dp replicas),
// known in advance and moved for free: the ceiling of re-partitioning.
// Re-packing and re-shaping change the grid and are not bounded by it.
absl::StatusOr<nlohmann::ordered_json> OracleJson(const core::Trace& trace,
                                                  const core::ReplayConfig& c, int dp,
                                                  double static_total_s) {
  core::ShapeSpec spec;
  spec.global_microbatches = c.microbatches * dp;
  spec.schedule = c.schedule;
  spec.data_parallel = service::AutoOptions{}.data_parallel;
  double total = 0;
  for (const core::TraceRecord& record : trace) {
    core::PipelineModel model;
    model.layers = core::LayerCostsOf(record);
    const int64_t bytes_per_param = service::JobReplayConfig{}.bytes_per_param;
    for (core::LayerCost& l : model.layers) l.params = l.resident_bytes / bytes_per_param;
    core::StageSpec stage;
    stage.capacity_bytes = c.stage_capacity_bytes;
    model.stages.assign(static_cast<size_t>(c.stages), stage);
    core::PartitionOptions po;
    po.method = core::PartitionMethod::kOptimal;
    absl::StatusOr<core::PartitionResult> best = core::Partition(model, po);
    if (!best.ok()) return best.status();
    absl::StatusOr<core::ShapeCost> cost =
        core::CostOfGrid(model.layers, spec, core::Grid{c.stages, dp, best->boundaries});
    if (!cost.ok()) return cost.status();
    total += cost->iteration_s;
  }
  nlohmann::ordered_json j;
  j["what"] = "re-partition ceiling: each iteration on its own optimum, moved for free";
  j["total_s"] = total;
  j["speedup"] = total > 0 ? static_total_s / total : 1.0;
  return j;
}

}  // namespace dynmo::tools
