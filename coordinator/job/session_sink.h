// SessionSink: where a job sends its ranks' downstream messages (plan
// PREPARE / COMMIT / ABORT): a one-rank Session stream or a node relay's
// HostSession, which carries several ranks; tests implement it with a
// vector. SendTo never blocks: an implementation queues
// and drops messages once its session has ended. Messages are shared and
// immutable, so a broadcast to thousands of ranks copies no plan. Close ends
// the session with a status (e.g. when a newer session of the same rank
// replaces it). Implementations must be thread-safe; JobState never calls
// them while holding its own lock.
#ifndef DYNMO_COORDINATOR_JOB_SESSION_SINK_H_
#define DYNMO_COORDINATOR_JOB_SESSION_SINK_H_

#include <memory>

#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "dynmo/v1/agent.pb.h"

namespace dynmo::service {

class SessionSink {
 public:
  virtual ~SessionSink() = default;
  // `message` for `ranks` (all carried by this session). A one-rank session
  // needs no addressing and ignores them.
  virtual void SendTo(absl::Span<const int> ranks,
                      std::shared_ptr<const dynmo::v1::CoordinatorMessage> message) = 0;
  virtual void Close(const absl::Status& status) = 0;
  // The host a multiplexed session serves; empty for a one-rank session.
  virtual const std::string& host() const {
    static const std::string kNone;
    return kNone;
  }
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_SESSION_SINK_H_
