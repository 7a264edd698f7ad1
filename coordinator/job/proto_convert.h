// The wire messages (dynmo.v1) to and from the plain structs of the decision
// core and of policy.h, in one place: a rank's LayerSample and the core's
// LayerCost, the operator's Policy message and Policy. The Plan's layout from
// a Decision is plan_convert.h (the trainer's tests read it back). Messages
// come in already validated (validation.h) except where a function says it
// checks. Pure; thread-safe.
#ifndef DYNMO_COORDINATOR_JOB_PROTO_CONVERT_H_
#define DYNMO_COORDINATOR_JOB_PROTO_CONVERT_H_

#include "absl/status/statusor.h"
#include "coordinator/core/cost_model.h"
#include "coordinator/job/policy.h"
#include "dynmo/v1/agent.pb.h"
#include "dynmo/v1/operator.pb.h"
#include "dynmo/v1/plan.pb.h"

namespace dynmo::service {

// One measured layer as the core's LayerCost (id = the sample's layer).
core::LayerCost LayerCostFromSample(const dynmo::v1::LayerSample& sample);
// The reverse, for JobStatus.
dynmo::v1::LayerSample LayerSampleFromCost(const core::LayerCost& cost);

// Parses and checks an operator policy. Empty balancer / trigger fields keep
// the values of `base`. Errors: INVALID_ARGUMENT naming the field.
absl::StatusOr<Policy> PolicyFromProto(const dynmo::v1::Policy& proto,
                                       const Policy& base);
dynmo::v1::Policy PolicyToProto(const Policy& policy);

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_PROTO_CONVERT_H_
