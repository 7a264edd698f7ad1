// JobState's views as messages: the summary and status operators read, the
// durable record, and the GPU placements the scheduler lists, each made
// under the job's lock by job_record.h from the job's parts.
//
// Part of JobState (job_state.h).
#include <vector>

#include "coordinator/service/job_record.h"
#include "coordinator/service/job_state.h"

namespace dynmo::service {

JobParts JobState::PartsLocked() const {
  return JobParts{roster_, protocol_, layout_, rebalancer_, reports_, owner_};
}

dynmo::v1::JobSummary JobState::Summary() const {
  absl::MutexLock lock(&mu_);
  return MakeJobSummary(PartsLocked());
}

dynmo::v1::JobStatus JobState::Status() const {
  absl::MutexLock lock(&mu_);
  return MakeJobStatus(PartsLocked(), ModelLocked());
}

std::vector<dynmo::v1::GpuPlacement> JobState::Placements() const {
  absl::MutexLock lock(&mu_);
  return MakePlacements(PartsLocked());
}

dynmo::v1::JobRecord JobState::Record() const {
  absl::MutexLock lock(&mu_);
  return MakeJobRecord(PartsLocked());
}

}  // namespace dynmo::service
