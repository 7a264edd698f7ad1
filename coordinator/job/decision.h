// Decision: one job's "what should the layout be now", computed by the
// decision core from the aggregated per-layer costs. It is the layout part
// of the plan every rank will execute — a wire::Plan as the balancer filled
// it — so issuing it copies no field: the plan protocol adds the job, epoch,
// apply iteration, reason and time. The core's stage indices (0..active-1)
// are mapped back to the job's original stage ids, so migrations, splits
// and released stages name pipeline ranks the trainer knows.
// A pure function: no clock, no lock, no I/O.
#ifndef DYNMO_COORDINATOR_JOB_DECISION_H_
#define DYNMO_COORDINATOR_JOB_DECISION_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/boundaries.h"
#include "core/cost_model.h"
#include "core/migration.h"
#include "core/repack.h"
#include "core/reshape.h"
#include "coordinator/job/policy.h"
#include "wire/plan_codec.h"

namespace dynmo::service {

struct DecisionInput {
  core::PipelineModel model;        // stages = the active stages, in order
  std::vector<int> active_stages;   // original stage id of each model stage
  core::Boundaries current;         // over the active stages
  double near_tie = 0;              // core::PartitionOptions::near_tie
  Policy policy;
  // Stages the job started with (active + released). Re-pack tolerance is
  // relative to the optimal bottleneck on that many stages like the active
  // ones, so re-packs never compound. 0 = the active stages.
  int full_stages = 0;
  // For re-shaping (policy.elastic = reshape): the replicas per stage, the
  // micro-batches each replica runs per iteration, the schedule, and the
  // cluster's data-parallel costs.
  int data_parallel = 1;
  int microbatches = 1;
  core::Schedule schedule = core::Schedule::k1F1B;
  core::DataParallelSpec data_parallel_spec;
  // Each rank's measured speed by position p = model stage * data_parallel
  // + replica (plan.proto's Reshape rule), for pricing re-shaped grids on
  // the devices they would run on. Empty: each rank at its model stage's
  // speed (its slowest replica's).
  std::vector<double> rank_speeds;
  // The job's step time on the current layout, measured (the median of its
  // newest iterations, PlanGains::CurrentStepTime); 0 = not known yet.
  // What it holds beyond the model's predicted iteration (the optimizer,
  // the data, the host) no layout changes, so every price carries it.
  double measured_iteration_s = 0;
};

// The layout part of a plan (wire::Plan's fields, original stage ids):
// `boundaries` over `active_stages`; `released_stages`; `migrations` in
// their rounds; `split`; `migration_bytes`; `previous_bottleneck_s` (now)
// and `predicted_bottleneck_s` (after): the job's step time per
// micro-batch, priced as the simulator's iteration of the schedule
// (core::PredictedIterationTime, every rank at its speed, exchanges
// included) plus the part of the measured step the model does not explain
// — what the plan is predicted to gain is their ratio, the same quantity
// its realized gain is measured in. Set when the decision re-shapes the
// job, `reshape` holds the grid: `boundaries` are then over the new stages
// 0..pp-1 (`active_stages`), nothing is released, migrations and split
// are empty, migration_bytes is the copies' total, and the two prices are
// the grids' iteration times (core::CostOfGrid) per original micro-batch.
struct Decision : wire::Plan {
  bool changes_layout = false;
  // The slowest stage's seconds per micro-batch now and after (the
  // balancer's objective; 0 for a re-shape): what the auto gate weighs
  // against the layers' timing noise.
  double previous_stage_s = 0;
  double predicted_stage_s = 0;
};

// Runs the policy's balancer (and RepackOptimal when re-packing is on and it
// can release a stage). With elastic = reshape, no stage is released:
// when every stage is active and the fastest feasible grid of the job's
// ranks (core::FeasibleShapes) has another pipeline depth and beats both
// re-balancing in place and releasing by 1%, the decision re-shapes. Errors come from the core (invalid model, caps no
// partition satisfies) or from a current layout that does not fit the model.
absl::StatusOr<Decision> Decide(const DecisionInput& input);

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_DECISION_H_
