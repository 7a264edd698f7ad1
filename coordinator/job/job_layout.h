// JobLayout: the layout a job's pipeline runs under: which of its stages are
// active (the others were released by re-packing), the layer boundaries over
// them, and the schedule and micro-batch count that size each stage's
// activation memory. A plain value; thread-compatible. The functions below
// are pure.
#ifndef DYNMO_COORDINATOR_JOB_JOB_LAYOUT_H_
#define DYNMO_COORDINATOR_JOB_JOB_LAYOUT_H_

#include <string>
#include <vector>

#include "core/boundaries.h"
#include "core/pipeline_sim.h"
#include "dynmo/v1/agent.pb.h"

namespace dynmo::service {

struct JobLayout {
  core::Boundaries boundaries;     // over the active stages
  std::vector<int> active_stages;  // original stage ids, sorted
  core::Schedule schedule = core::Schedule::k1F1B;
  int microbatches = 1;
};

// Sets the stages and boundaries in force: `active` and `boundaries`, or,
// where they are empty, every one of `pipeline_size` stages and uniform
// boundaries of `num_layers` layers over the active stages.
void SetStages(std::vector<int> active, core::Boundaries boundaries,
               int pipeline_size, int num_layers, JobLayout* layout);

// SetStages with the stages and boundaries a registering rank runs.
void SetStagesOf(const dynmo::v1::RegisterRequest& rank, JobLayout* layout);

// A job's first layout, from what registered it or what the state dir
// holds: `microbatches` (1 when not positive), `schedule` (1F1B when it
// does not parse), then SetStages.
JobLayout StartingLayout(int microbatches, const std::string& schedule,
                         std::vector<int> active, core::Boundaries boundaries,
                         int pipeline_size, int num_layers);

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_JOB_LAYOUT_H_
