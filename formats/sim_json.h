// JSON views of the simulator's and the replay's results, as dynmo-sim
// prints them. Keys keep the order written here (nlohmann::ordered_json), so
// the output reads top-down: the headline numbers first, then the detail.
//
//   SimResult    {"iteration_time":s,"bubble_ratio":r,"stage_idle":[s,...]}
//   ReplayResult {"stages":P,"schedule":..,"microbatches":M,"balancer":..,
//                 "trigger":..,"migration_bandwidth":B,"iterations":K,
//                 "static_total_s":..,"dynamic_total_s":..,"speedup":..,
//                 "decisions":..,"rebalances":..,"moved_bytes":..,
//                 "migration_s":..,"mean_imbalance":{"static":..,"dynamic":..},
//                 "mean_bubble_ratio":{"static":..,"dynamic":..},
//                 "fits_memory":{"static":..,"dynamic":..},
//                 "static_boundaries":[..],"final_boundaries":[..],
//                 "rebalance_iters":[..]}
// Times are seconds. Pure; thread-compatible.
#ifndef DYNMO_FORMATS_SIM_JSON_H_
#define DYNMO_FORMATS_SIM_JSON_H_

#include "core/pipeline_sim.h"
#include "core/replay.h"
#include "nlohmann/json.hpp"

namespace dynmo::formats {

nlohmann::ordered_json SimResultToJson(const core::SimResult& result);

// The result with the configuration that produced it.
nlohmann::ordered_json ReplayResultToJson(const core::ReplayResult& result,
                                          const core::ReplayConfig& config);

}  // namespace dynmo::formats

#endif  // DYNMO_FORMATS_SIM_JSON_H_
