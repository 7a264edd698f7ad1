// Decision: one job's "what should the layout be now", computed by the
// decision core from the aggregated per-layer costs. Maps the core's stage
// indices (0..active-1) back to the job's original stage ids, so migrations,
// splits and released stages name pipeline ranks the trainer knows.
// A pure function: no clock, no lock, no I/O.
#ifndef DYNMO_COORDINATOR_JOB_DECISION_H_
#define DYNMO_COORDINATOR_JOB_DECISION_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/core/boundaries.h"
#include "coordinator/core/cost_model.h"
#include "coordinator/core/migration.h"
#include "coordinator/core/repack.h"
#include "coordinator/core/reshape.h"
#include "coordinator/job/policy.h"

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
};

// A re-shape of the job's ranks into pp x dp (plan.proto's Reshape).
struct ReshapeChoice {
  int pipeline_size = 1;
  int data_parallel = 1;
  int64_t copy_bytes = 0;
  double microbatches_per_s = 0;           // after
  double previous_microbatches_per_s = 0;  // the shape in force, re-balanced
  double release_microbatches_per_s = 0;   // re-packing with release; 0: none
};

struct Decision {
  bool changes_layout = false;
  core::Boundaries boundaries;        // over `active_stages`
  std::vector<int> active_stages;     // original ids
  std::vector<int> released_stages;   // original ids
  std::vector<core::LayerMigration> migrations;  // original ids
  std::vector<core::CommSplit> split;            // original ids
  int64_t migration_bytes = 0;
  double current_bottleneck_s = 0;
  double predicted_bottleneck_s = 0;
  // Set when the decision re-shapes the job: `boundaries` are then over the
  // new stages 0..pp-1 (`active_stages`), nothing is released, migrations
  // and split are empty, migration_bytes is the copies' total, and the two
  // bottlenecks are the iteration times per original micro-batch.
  std::optional<ReshapeChoice> reshape;
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
