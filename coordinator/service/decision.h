// Decision: one job's "what should the layout be now", computed by the
// decision core from the aggregated per-layer costs. Maps the core's stage
// indices (0..active-1) back to the job's original stage ids, so migrations,
// splits and released stages name pipeline ranks the trainer knows.
// A pure function: no clock, no lock, no I/O.
#ifndef DYNMO_COORDINATOR_SERVICE_DECISION_H_
#define DYNMO_COORDINATOR_SERVICE_DECISION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/core/boundaries.h"
#include "coordinator/core/cost_model.h"
#include "coordinator/core/migration.h"
#include "coordinator/core/repack.h"
#include "coordinator/service/policy.h"

namespace dynmo::service {

struct DecisionInput {
  core::PipelineModel model;        // stages = the active stages, in order
  std::vector<int> active_stages;   // original stage id of each model stage
  core::Boundaries current;         // over the active stages
  Policy policy;
  // Stages the job started with (active + released). Re-pack tolerance is
  // relative to the optimal bottleneck on that many stages like the active
  // ones, so re-packs never compound. 0 = the active stages.
  int full_stages = 0;
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
};

// Runs the policy's balancer (and RepackOptimal when re-packing is on and it
// can release a stage). Errors come from the core (invalid model, caps no
// partition satisfies) or from a current layout that does not fit the model.
absl::StatusOr<Decision> Decide(const DecisionInput& input);

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_DECISION_H_
