// Replay: what a trace (trace.h) would have cost on a pipeline of P stages
// under a static partition and under DynMo's dynamic rebalancing.
//
// Static holds the uniform partition (Megatron's default) for the whole
// trace. Dynamic starts from the same uniform partition; after each record,
// the trigger (rebalance_trigger.h) may run the balancer on the records
// since the last decision, smoothed (SmoothedCosts: their mean, cut at the
// newest step change), and the new partition takes effect from the next
// record. A proposal is adopted only when it promises at least min_gain on
// that smoothed profile; each adopted change is charged its migration:
// PlanMigrationBetween's bytes divided by the migration bandwidth.
//
// Every record counts as one iteration (iter only orders them). An
// iteration's time is SimulatePipeline's iteration time for the partition in
// force, with stage passes from StagePassTimesFor. Pure; thread-compatible.
#ifndef DYNMO_CORE_REPLAY_H_
#define DYNMO_CORE_REPLAY_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/boundaries.h"
#include "core/partition.h"
#include "core/pipeline_sim.h"
#include "core/rebalance_trigger.h"
#include "core/trace.h"

namespace dynmo::core {

struct ReplayConfig {
  int stages = 4;
  Schedule schedule = Schedule::k1F1B;
  int microbatches = 16;
  PartitionMethod balancer = PartitionMethod::kOptimal;
  RebalanceTrigger trigger;
  // Bytes per second a layer migration moves at; 0 = migration is free.
  double migration_bandwidth_bytes_per_s = 0;
  // Memory cap of every stage in bytes; < 0 = unbounded. The balancers that
  // honour caps (optimal, diffusion) keep the dynamic partition under it.
  int64_t stage_capacity_bytes = -1;
  // A proposal is adopted only if the simulator, on the profile it was
  // decided on, predicts an iteration at least this fraction faster than the
  // partition in force. Smaller promises are within the noise of one
  // profile, and chasing them moves layers back and forth for nothing.
  // A partition that breaks a memory cap is always left.
  double min_gain = 0.01;
};

struct ReplayResult {
  int iterations = 0;
  double static_total_s = 0;
  double dynamic_total_s = 0;  // includes migration_s
  double speedup = 1;          // static_total_s / dynamic_total_s
  int decisions = 0;           // times the trigger fired and the balancer ran
  int rebalances = 0;          // decisions whose proposal was adopted
  int64_t moved_bytes = 0;
  double migration_s = 0;
  // Means over records of Imbalance(StageLoads) and the simulator's bubble
  // ratio, for the partition in force at each record.
  double mean_imbalance_static = 0;
  double mean_imbalance_dynamic = 0;
  double mean_bubble_static = 0;
  double mean_bubble_dynamic = 0;
  // False when some record's partition exceeds the stage capacity.
  bool static_fits_memory = true;
  bool dynamic_fits_memory = true;
  Boundaries static_boundaries;
  Boundaries final_boundaries;
  std::vector<int64_t> rebalance_iters;  // iter of the profile each used
};

// Returns OK when stages and microbatches are >= 1, the bandwidth is finite
// and >= 0, min_gain is in [0, 1), and the trigger is valid and replayable.
absl::Status ValidateReplayConfig(const ReplayConfig& config);
// OK for a valid every:N or on-change[:T]; the coordinator's kinds
// (on-event, auto, manual) need ranks and a payback gate a trace lacks.
absl::Status ValidateReplayTrigger(const RebalanceTrigger& trigger);

// Replays `trace` under `config`. Errors: an invalid trace or config, more
// stages than layers, or a balancer failure (e.g. caps nothing satisfies),
// named with the iter it happened at.
absl::StatusOr<ReplayResult> ReplayTrace(const Trace& trace,
                                         const ReplayConfig& config);

}  // namespace dynmo::core

#endif  // DYNMO_CORE_REPLAY_H_
