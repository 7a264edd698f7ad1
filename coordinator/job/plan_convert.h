// A Decision (decision.h) as the layout part of a plan: new boundaries,
// active and released stages, the migration list in its rounds, the
// communicator split, bytes and bottlenecks, and a re-shape's grid — what
// every rank executes as sent (trainer/elastic/plan_step.h reads the same
// wire::Plan back). Stage ids are the decision's original ids, unchanged.
// Epoch, apply iteration, reason and timestamps are the plan protocol's,
// set by the caller. Pure; thread-safe.
#ifndef DYNMO_COORDINATOR_JOB_PLAN_CONVERT_H_
#define DYNMO_COORDINATOR_JOB_PLAN_CONVERT_H_

#include "coordinator/job/decision.h"
#include "wire/plan_codec.h"

namespace dynmo::service {

wire::Plan PlanOfDecision(const Decision& decision);

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_PLAN_CONVERT_H_
