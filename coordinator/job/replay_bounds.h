// Replay bounds: what no coordinator could beat on a trace, so a what-if's
// figure can be read against a ceiling instead of a hope. Three ceilings,
// each known in advance and moved for free:
//
//   delayed oracle   record t on the optimum of record t - lead (static
//                    before): what a coordinator that decides at once on
//                    exact costs still gets when its plans take `lead`
//                    iterations to reach every rank (JobOptions's plan lead).
//                    Computed by the replay itself (job_replay.h), which
//                    knows the ranks' true speeds.
//   release          the fewest GPU-seconds any schedule of stage counts
//                    can spend while keeping a share of static's tokens/s
//                    over the whole run: a Lagrangian lower bound of
//                      min sum_t s_t dp T_t(s_t)
//                      s.t. sum_t T_t(s_t) <= sum_t static_t / share,
//                    T_t(s) being record t on the optimal partition over
//                    s stages x dp replicas (memory caps honoured). Any
//                    multiplier gives a valid bound; the best of a fixed grid
//                    of multipliers is returned. Weak duality: no release
//                    plan, however timed, uses fewer.
//   reshape          each record on the fastest feasible grid pp' x dp' of
//                    the job's ranks (core::FeasibleShapes, copies free),
//                    over the whole run and over its last part (where a
//                    pruned or frozen model has shrunk the most).
//
// Ranks slower than the rest are placed optimistically: the release bound
// keeps the fastest s x dp ranks, the reshape bound puts the fastest first.
// Pure and deterministic; thread-compatible.
#ifndef DYNMO_COORDINATOR_JOB_REPLAY_BOUNDS_H_
#define DYNMO_COORDINATOR_JOB_REPLAY_BOUNDS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "core/cost_model.h"
#include "core/reshape.h"

namespace dynmo::service {

struct ElasticBoundsInput {
  // Per record: its layers (params set for the all-reduce) and what it took
  // static (pp x dp on the uniform split).
  std::vector<std::vector<core::LayerCost>> records;
  std::vector<double> static_iteration_s;
  // Per record, every rank's true speed (pp x dp of them); empty: all at 1.
  std::vector<std::vector<double>> rank_speeds;
  // G, the schedule, the data-parallel costs and the device (its memory
  // capacity); rank_speeds here is ignored.
  core::ShapeSpec spec;
  int pp = 1;
  int dp = 1;
  double min_throughput_share = 0.98;  // release: of static's tokens/s, in (0, 1]
  double tail_fraction = 0.1;          // reshape: the last part of the run, in (0, 1]
};

struct ReleaseBound {
  double static_gpu_s = 0;
  double min_gpu_s = 0;  // no release schedule spends less at the share
  double fraction = 1;   // min_gpu_s / static_gpu_s
};

struct ReshapeBound {
  double total_s = 0;      // every record on its fastest grid
  double speedup = 1;      // static's total over total_s
  double tail_speedup = 1;  // the same over the last tail_fraction of records
};

// Errors: sizes that disagree, pp or dp < 1, a share or tail outside (0, 1],
// or the core's (a record no grid fits).
absl::StatusOr<ReleaseBound> ReleaseGpuSecondsBound(const ElasticBoundsInput& in);
absl::StatusOr<ReshapeBound> ReshapeSpeedBound(const ElasticBoundsInput& in);

// The records of the last `tail_fraction` of n (at least one): the index the
// tail starts at.
int TailStart(int n, double tail_fraction);

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_REPLAY_BOUNDS_H_
