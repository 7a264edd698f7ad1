// OperatorClient: what a trainer asks of a job beyond its own rank's
// protocol — set the job's policy (balancer, trigger, re-packing) and read
// how many ranks are still connected — over the coordinator's
// OperatorService. The trainer goes through this instead of opening stubs of
// its own, so it depends on the agent only.
//
// Thread-compatible: one caller at a time (the stub itself is thread-safe).
#ifndef DYNMO_AGENT_OPERATOR_CLIENT_H_
#define DYNMO_AGENT_OPERATOR_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/channel.h"
#include "dynmo/v1/operator.grpc.pb.h"

namespace dynmo::agent {

struct JobPolicy {
  std::string balancer;  // empty: the coordinator's default
  std::string trigger;   // empty: the coordinator's default
  bool repack = false;
  double repack_tolerance = 0;
  std::string elastic;   // "release" | "reshape"; empty: unchanged
};

class OperatorClient {
 public:
  // `token` is sent as a bearer token when not empty.
  static absl::StatusOr<OperatorClient> Connect(const std::string& address,
                                                const ChannelOptions& channel,
                                                std::string token = "");

  // Sets `job`'s policy. The job appears once a rank registered: NOT_FOUND
  // and UNAVAILABLE are retried until `patience` ran out. A policy the
  // coordinator refuses is INVALID_ARGUMENT with its message; anything else
  // that does not succeed in time is returned as is.
  absl::Status SetPolicy(const std::string& job, const JobPolicy& policy,
                         absl::Duration patience = absl::Seconds(2));

  // Ranks of `job` with a live session (NOT_FOUND for an unknown job).
  absl::StatusOr<int> ConnectedRanks(const std::string& job);

 private:
  OperatorClient(std::unique_ptr<dynmo::v1::OperatorService::Stub> stub,
                 std::string token)
      : stub_(std::move(stub)), token_(std::move(token)) {}

  std::unique_ptr<dynmo::v1::OperatorService::Stub> stub_;
  std::string token_;
};

}  // namespace dynmo::agent

#endif  // DYNMO_AGENT_OPERATOR_CLIENT_H_
