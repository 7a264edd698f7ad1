// Upstream: a node relay's side toward the coordinator. It holds ONE
// HostSession (an rpc::ClientStream, the stream engine the agents run too)
// for a fixed set of the attached ranks, and replaces it by a new one when
// the set changes (ReopenLocked): the coordinator replaces the older session
// of the same host and re-sends any plan message in flight. Its writes are
// batches of the carried ranks' queued messages (Membership::FillBatch);
// each plan message it reads is written once to each listed rank's session.
// A session that ends without being replaced makes the upstream lost(): the
// relay then ends every rank's session, so that each agent registers again.
//
// Sessions replaced or lost are retired and deleted once done (ReapLocked).
//
// Thread-safety: guarded by the relay's mutex (given to the constructor),
// which also guards the Membership it reads; methods named *Locked require
// it, the others take it. ReopenLocked releases it while starting and
// cancelling sessions.
#ifndef DYNMO_RELAY_UPSTREAM_H_
#define DYNMO_RELAY_UPSTREAM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "dynmo/v1/agent.grpc.pb.h"
#include "grpcpp/channel.h"
#include "relay/membership.h"
#include "relay/relay_config.h"
#include "rpc/client_stream.h"

namespace dynmo::relay {

class Upstream {
 public:
  // `mu` and `members` outlive the Upstream.
  Upstream(absl::Mutex* mu, Membership* members,
           std::shared_ptr<grpc::Channel> channel, std::string job,
           std::string host, size_t max_batch);
  ~Upstream();  // requires CloseLocked(), then quiet and reaped
  Upstream(const Upstream&) = delete;
  Upstream& operator=(const Upstream&) = delete;

  // Starts a write on the live session, if any (after a rank queued).
  void Kick();

  // Replaces the live session by one that carries `ranks` (with their
  // session keys) under `token`; none when `ranks` is empty.
  void ReopenLocked(std::vector<int> ranks, std::vector<std::string> keys,
                    const std::string& token) ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_);
  // The live session ended without being replaced.
  bool lost() const ABSL_SHARED_LOCKS_REQUIRED(*mu_) { return lost_; }
  // Why the newest lost session ended.
  const std::string& last_error() const ABSL_SHARED_LOCKS_REQUIRED(*mu_) {
    return last_error_;
  }
  // Retires the lost session and counts the break.
  void ForgetLostLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_);
  // Deletes the retired sessions that are done (none while one is kicked).
  void ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_);
  // How many ranks the live session carries once established (0: none).
  int CarriedLocked() const ABSL_SHARED_LOCKS_REQUIRED(*mu_);

  // Stopping: a session that ends from now on is not lost.
  void StopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_) { stopping_ = true; }
  // Cancels and retires the live session (once the relay's thread is gone).
  void CloseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_);
  // Every session is done and none is kicked: ReapLocked deletes them all.
  bool QuietLocked() const ABSL_SHARED_LOCKS_REQUIRED(*mu_);

  // Fills the upstream fields of `stats`.
  void FillStatsLocked(NodeRelayStats* stats) const ABSL_SHARED_LOCKS_REQUIRED(*mu_);

 private:
  class HostSession;

  void RetireLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_);
  // A plan message read, to each listed rank's session.
  void ToRanks(const dynmo::v1::HostCoordinatorMessage& message);

  absl::Mutex* const mu_;
  Membership* const members_;  // guarded by *mu_
  const std::unique_ptr<dynmo::v1::AgentService::Stub> stub_;
  const std::string job_;
  const std::string host_;
  const size_t max_batch_;

  bool stopping_ ABSL_GUARDED_BY(*mu_) = false;
  bool lost_ ABSL_GUARDED_BY(*mu_) = false;
  rpc::LiveStream<HostSession> live_{mu_};
  std::vector<HostSession*> retired_ ABSL_GUARDED_BY(*mu_);
  // The NodeRelayStats fields of the upstream side.
  int64_t sessions_ ABSL_GUARDED_BY(*mu_) = 0;
  int64_t breaks_ ABSL_GUARDED_BY(*mu_) = 0;
  int64_t messages_up_ ABSL_GUARDED_BY(*mu_) = 0;
  int64_t messages_down_ ABSL_GUARDED_BY(*mu_) = 0;
  int64_t messages_read_ ABSL_GUARDED_BY(*mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(*mu_);
};

}  // namespace dynmo::relay

#endif  // DYNMO_RELAY_UPSTREAM_H_
