#include "formats/sim_json.h"

#include "core/partition.h"
#include "core/rebalance_trigger.h"

namespace dynmo::formats {

using Json = nlohmann::ordered_json;

Json SimResultToJson(const core::SimResult& result) {
  Json j;
  j["iteration_time"] = result.iteration_time_s;
  j["bubble_ratio"] = result.bubble_ratio;
  j["stage_idle"] = result.stage_idle_s;
  return j;
}

Json ReplayResultToJson(const core::ReplayResult& result,
                        const core::ReplayConfig& config) {
  Json j;
  j["stages"] = config.stages;
  j["schedule"] = core::ScheduleName(config.schedule);
  j["microbatches"] = config.microbatches;
  j["balancer"] = core::PartitionMethodName(config.balancer);
  j["trigger"] = core::TriggerName(config.trigger);
  j["migration_bandwidth"] = config.migration_bandwidth_bytes_per_s;
  j["iterations"] = result.iterations;
  j["static_total_s"] = result.static_total_s;
  j["dynamic_total_s"] = result.dynamic_total_s;
  j["speedup"] = result.speedup;
  j["decisions"] = result.decisions;
  j["rebalances"] = result.rebalances;
  j["moved_bytes"] = result.moved_bytes;
  j["migration_s"] = result.migration_s;
  j["mean_imbalance"] = {{"static", result.mean_imbalance_static},
                         {"dynamic", result.mean_imbalance_dynamic}};
  j["mean_bubble_ratio"] = {{"static", result.mean_bubble_static},
                            {"dynamic", result.mean_bubble_dynamic}};
  j["fits_memory"] = {{"static", result.static_fits_memory},
                      {"dynamic", result.dynamic_fits_memory}};
  j["static_boundaries"] = result.static_boundaries;
  j["final_boundaries"] = result.final_boundaries;
  j["rebalance_iters"] = result.rebalance_iters;
  return j;
}

}  // namespace dynmo::formats
