// The operator's Policy message to and from policy.h's Policy. (Layer
// samples and plans go through the one wire codec, wire/; a Decision is
// a wire::Plan's layout part, decision.h.) Pure; thread-safe.
#ifndef DYNMO_COORDINATOR_JOB_PROTO_CONVERT_H_
#define DYNMO_COORDINATOR_JOB_PROTO_CONVERT_H_

#include "absl/status/statusor.h"
#include "core/cost_model.h"
#include "coordinator/job/policy.h"
#include "dynmo/v1/agent.pb.h"
#include "dynmo/v1/operator.pb.h"
#include "dynmo/v1/plan.pb.h"

namespace dynmo::service {

// Parses and checks an operator policy. Empty balancer / trigger fields keep
// the values of `base`. Errors: INVALID_ARGUMENT naming the field.
absl::StatusOr<Policy> PolicyFromProto(const dynmo::v1::Policy& proto,
                                       const Policy& base);
dynmo::v1::Policy PolicyToProto(const Policy& policy);

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_PROTO_CONVERT_H_
