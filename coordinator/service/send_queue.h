// SendQueue: one job's downstream messages on their way to the sessions.
// Messages, and sessions to close, are queued while the job's lock is held
// and delivered by Deliver() after it is released: a broadcast to thousands
// of sessions never stalls the job's reports, and gRPC, which may run a
// session's OnDone inline (which detaches from the job), is never called
// under the job's lock. Deliver() takes batches in the order they were
// queued and delivers one batch at a time, so a COMMIT never overtakes its
// PREPARE; replaced sessions are closed before the batch's messages go out.
//
// Thread-safe: Queue and Close are called under the owner's lock (the one
// given to the constructor), Deliver without it; lock order: delivery lock
// -> owner's lock.
#ifndef DYNMO_COORDINATOR_SERVICE_SEND_QUEUE_H_
#define DYNMO_COORDINATOR_SERVICE_SEND_QUEUE_H_

#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/job/session_sink.h"
#include "dynmo/v1/agent.pb.h"

namespace dynmo::service {

class SendQueue {
 public:
  // `owner_mu` (not owned) is the lock Queue and Close are called under.
  explicit SendQueue(absl::Mutex* owner_mu) : owner_mu_(owner_mu) {}

  // `message` for `ranks` of `sink` (SessionSink::SendTo).
  void Queue(std::shared_ptr<SessionSink> sink, std::vector<int> ranks,
             std::shared_ptr<const dynmo::v1::CoordinatorMessage> message);
  // Closes `sink` with `why` (default: superseded by a newer session),
  // once, however often it is queued before the next delivery.
  void Close(const std::shared_ptr<SessionSink>& sink,
             absl::Status why = absl::AbortedError("superseded by a newer session"));
  // Delivers everything queued so far. Not under the owner's lock.
  void Deliver();

 private:
  struct PendingSend {
    std::shared_ptr<SessionSink> sink;
    std::vector<int> ranks;  // the ranks of `sink` it is for
    std::shared_ptr<const dynmo::v1::CoordinatorMessage> message;
  };

  absl::Mutex* const owner_mu_;
  absl::Mutex deliver_mu_;
  std::vector<PendingSend> sends_;                   // under *owner_mu_
  std::vector<std::pair<std::shared_ptr<SessionSink>, absl::Status>> closes_;  // under *owner_mu_
  std::atomic<bool> pending_{false};  // sends_ or closes_ is non-empty
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_SEND_QUEUE_H_
