// What a rank's messages must pass before a job applies anything of them (a
// refused message changes nothing): a report's or ack's rank, values and
// epoch, the layers a report times (only those the rank's stage holds under
// the layout in force), and the windows iterations and epochs must fall in
// (JobOptions::iteration_window, epoch_window). Pure functions of the job's
// parts (job_record.h).
//
// Thread-compatible: the caller holds the job's lock.
#ifndef DYNMO_COORDINATOR_JOB_UPSTREAM_CHECKS_H_
#define DYNMO_COORDINATOR_JOB_UPSTREAM_CHECKS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/cost_model.h"
#include "coordinator/job/job_effects.h"
#include "coordinator/job/job_record.h"
#include "dynmo/v1/agent.pb.h"

namespace dynmo::service {

// NOT_FOUND for a rank outside the job; INVALID_ARGUMENT for bad values,
// an epoch never issued, an iteration beyond the window or a layer the
// rank's stage does not hold; FAILED_PRECONDITION for APPLIED of a plan
// never committed. A report's layers, read as they are checked
// (wire::ReadReport), go to `layers` (left empty for an ack).
absl::Status CheckUpstream(const JobParts& job, const UpstreamMessage& m,
                           int64_t iteration_window, std::vector<core::LayerCost>* layers);
// INVALID_ARGUMENT for an iteration more than `iteration_window` beyond the
// job's newest.
absl::Status CheckIteration(const JobParts& job, int64_t iteration,
                            int64_t iteration_window);
// INVALID_ARGUMENT for registered epochs more than `epoch_window` beyond
// the job's; FAILED_PRECONDITION for an applied epoch the job never issued
// (taken only as the first rank of a job that never planned: a lost state
// dir).
absl::Status CheckRegisterEpochs(const JobParts& job, const dynmo::v1::RegisterRequest& r,
                                 uint64_t epoch_window);

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_UPSTREAM_CHECKS_H_
