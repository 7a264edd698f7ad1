// The layout part of a Plan message from a Decision (decision.h): new
// boundaries, active and released stages, the migration list in its rounds,
// the communicator split, bytes and bottlenecks — what every rank executes
// as sent (trainer/elastic/plan_step.h reads it back). Epoch, apply iteration,
// reason and timestamps are the plan protocol's, set by the caller.
// Pure; thread-safe.
#ifndef DYNMO_COORDINATOR_JOB_PLAN_CONVERT_H_
#define DYNMO_COORDINATOR_JOB_PLAN_CONVERT_H_

#include "coordinator/job/decision.h"
#include "dynmo/v1/plan.pb.h"

namespace dynmo::service {

// Fills `plan`'s layout fields from `decision` (appends to its lists).
void SetPlanLayout(const Decision& decision, dynmo::v1::Plan* plan);

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_PLAN_CONVERT_H_
