// absl::Status <-> grpc::Status for the coordinator's RPC handlers, and the
// code names the RPC metrics are labelled with.
//
// Thread-safe (pure functions).
#ifndef DYNMO_COORDINATOR_SERVICE_GRPC_STATUS_H_
#define DYNMO_COORDINATOR_SERVICE_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace dynmo::service {

// absl and gRPC share their canonical codes; this keeps the message.
grpc::Status ToGrpcStatus(const absl::Status& status);
// "INVALID_ARGUMENT", ... for metric labels.
const char* GrpcCodeName(grpc::StatusCode code);

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_GRPC_STATUS_H_
