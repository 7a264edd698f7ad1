// SessionSink: where a job sends one rank's downstream messages (plan
// PREPARE / COMMIT / ABORT). The gRPC Session stream implements it; tests
// implement it with a vector. Send never blocks: an implementation queues
// and drops messages once its session has ended. Messages are shared and
// immutable, so a broadcast to thousands of ranks copies no plan. Close ends
// the session with a status (e.g. when a newer session of the same rank
// replaces it). Implementations must be thread-safe; JobState never calls
// them while holding its own lock.
#ifndef DYNMO_COORDINATOR_SERVICE_SESSION_SINK_H_
#define DYNMO_COORDINATOR_SERVICE_SESSION_SINK_H_

#include <memory>

#include "absl/status/status.h"
#include "dynmo/v1/agent.pb.h"

namespace dynmo::service {

class SessionSink {
 public:
  virtual ~SessionSink() = default;
  virtual void Send(
      std::shared_ptr<const dynmo::v1::CoordinatorMessage> message) = 0;
  virtual void Close(const absl::Status& status) = 0;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_SESSION_SINK_H_
