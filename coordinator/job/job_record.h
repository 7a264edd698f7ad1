// One job as messages: the durable JobRecord (what the state dir holds), the
// JobSummary and JobStatus operators read, and the RegisterResponse a rank
// gets, all made from the parts JobState composes. Pure; the caller holds
// the job's lock while the parts are read.
#ifndef DYNMO_COORDINATOR_JOB_JOB_RECORD_H_
#define DYNMO_COORDINATOR_JOB_JOB_RECORD_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/cost_model.h"
#include "coordinator/job/job_layout.h"
#include "coordinator/job/plan_lifecycle.h"
#include "coordinator/job/rank_roster.h"
#include "coordinator/job/rebalancer.h"
#include "dynmo/v1/agent.pb.h"
#include "dynmo/v1/operator.pb.h"
#include "dynmo/v1/state.pb.h"

namespace dynmo::service {

// The parts of one job (not owned).
struct JobParts {
  const RankRoster& roster;
  const PlanLifecycle& plans;
  const JobLayout& layout;
  const Rebalancer& rebalancer;
  int64_t reports = 0;  // iteration reports received
  const std::string& owner;  // the principal that created the job, if named
};

dynmo::v1::JobRecord MakeJobRecord(const JobParts& job);
dynmo::v1::JobSummary MakeJobSummary(const JobParts& job);
// `model` is the job's current PipelineModel; its layers and memory caps are
// listed when it is there.
dynmo::v1::JobStatus MakeJobStatus(
    const JobParts& job, const absl::StatusOr<core::PipelineModel>& model);
// Each registered rank's device and place in the current grid, or released.
std::vector<dynmo::v1::GpuPlacement> MakePlacements(const JobParts& job);
// The epochs and the layout, and whether `rank` (registered) was released.
dynmo::v1::RegisterResponse MakeRegisterResponse(const JobParts& job, int rank);

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_JOB_RECORD_H_
