// Elastic replay: what a trace (trace.h) costs a whole data-parallel job of
// pp x dp ranks under five ways of running it, side by side:
//
//   static       the uniform partition on pp stages, all the time;
//   repartition  DynMo's re-balancing on pp stages (every rank kept);
//   release      re-balancing plus re-packing onto the fewest stages whose
//                bottleneck stays within `repack_tolerance` of the STATIC
//                layout's on the same costs (what re-balancing gained is
//                taken as GPUs, not speed); the freed ranks (dp per stage)
//                go back to the cluster (counted out of GPU-seconds);
//   reshape      re-balancing plus re-shaping the same ranks into the grid
//                pp' x dp' the cost model (reshape.h) says is fastest;
//   oracle       every record on its own exact optimum on pp stages,
//                known in advance, moved for free (re-partitioning's
//                ceiling).
//
// Decisions are taken when the trigger fires (every:N or on-change) on costs
// SMOOTHED over a window matched to how the case changes (SmoothedCosts):
// up to `smoothing_window` records (0 = the trigger's period), cut at the
// newest step change, so jitter is averaged away while a step (a pruning
// step, a freeze) is followed at once, never decided on one record's noise.
// A change is adopted only when it promises `min_gain` on that smoothed
// profile and repays its pause within `payback_iterations`. The pause is
// its bytes over the migration bandwidth (re-partition and re-pack: the
// moved layers; re-shape: the busiest receiver's copies). Each record counts as one
// iteration of the global batch (spec.global_microbatches).
//
// Pure and deterministic; thread-compatible.
#ifndef DYNMO_CORE_ELASTIC_REPLAY_H_
#define DYNMO_CORE_ELASTIC_REPLAY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/rebalance_trigger.h"
#include "core/reshape.h"
#include "core/smoothed_costs.h"
#include "core/trace.h"

namespace dynmo::core {

enum class ElasticMode { kStatic, kRepartition, kRelease, kReshape, kOracle };

// "static", "repartition", "release", "reshape", "oracle".
std::string ElasticModeName(ElasticMode mode);

struct ElasticReplayConfig {
  int pp = 4;
  int dp = 1;
  ShapeSpec spec;  // G, device, link, data-parallel costs
  RebalanceTrigger trigger;
  int smoothing_window = 0;  // records; 0 = the trigger's period
  // A record whose layer times differ from the newer records' mean by more
  // than this (RelativeTimeChange) is before a step: the window stops there.
  double step_threshold = 0.05;
  double min_gain = 0.01;
  double repack_tolerance = 0.02;
  // Bytes per second a re-partition's or re-pack's layer moves run at;
  // 0 = free. Re-shape copies use spec.data_parallel.copy_bandwidth.
  double migration_bandwidth_bytes_per_s = 0;
  int payback_iterations = 50;
  // A layer's parameters, for the all-reduce: its traced bytes over this
  // (traces carry bytes, not parameter counts); 0 = no parameters.
  int64_t resident_bytes_per_param = 0;
};

// Returns OK for pp, dp >= 1, a valid spec, a replayable trigger, window
// >= 0, min_gain in [0, 1), tolerance, step threshold and bandwidth finite
// and >= 0, payback >= 1, bytes per param >= 0.
absl::Status ValidateElasticReplayConfig(const ElasticReplayConfig& config);

struct ElasticEvent {
  int64_t iter = 0;  // the record the decision was taken after
  std::string what;  // e.g. "24x30 -> 12x60", "release 3 stages"
};

struct ModeResult {
  ElasticMode mode = ElasticMode::kStatic;
  double total_s = 0;      // every iteration, plus migration pauses
  double migration_s = 0;
  double tokens_per_s = 0;
  double gpu_seconds = 0;  // ranks in use x time, summed
  double mean_gpus = 0;    // gpu_seconds / total_s
  // Tokens per second over the last tenth of the records (at least one).
  double final_tokens_per_s = 0;
  int changes = 0;         // adopted layout changes
  Grid final_grid;
  std::vector<ElasticEvent> events;
};

// The five modes, in the order of ElasticMode. Errors: invalid trace or
// config, more stages than layers, memory caps the start does not fit, named
// with the iter.
absl::StatusOr<std::vector<ModeResult>> ReplayElastic(
    const Trace& trace, const ElasticReplayConfig& config);

}  // namespace dynmo::core

#endif  // DYNMO_CORE_ELASTIC_REPLAY_H_
