// PendingSessions: the Session and HostSession streams that have not said
// hello yet. A stream costs the coordinator memory from the moment it opens,
// but names no job (and so no owner, no quota) until its hello; one that
// never says it would hold that memory forever. So each new stream is
// admitted only under two caps — pending streams from one peer host, and in
// all (RESOURCE_EXHAUSTED beyond either) — and must say hello within a
// deadline: past it the registry calls the stream's `expire` (which ends it
// with DEADLINE_EXCEEDED) and counts it.
//
// A stream's Wait settles once: Greeted (its hello came; from then on the
// registry never touches it), Expired (the deadline won: the stream must
// then do nothing more but end), or Gone (the stream ended first). `expire`
// runs after the wait settled as Expired, outside every lock (gRPC may run
// the stream's OnDone inline), so it must hold what it ends by a handle
// that outlives the reactor (an outbox: rpc/stream_outbox.h).
//
// Thread-safe; one reaper thread. The registry's lock and a wait's are
// never held together.
#ifndef DYNMO_COORDINATOR_SERVICE_PENDING_SESSIONS_H_
#define DYNMO_COORDINATOR_SERVICE_PENDING_SESSIONS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dynmo::service {

struct PendingLimits {
  absl::Duration hello_timeout = absl::Seconds(10);
  // A stream waiting for its hello costs gRPC ~290 KB (measured: 100 of
  // them, +29 MB), so the caps are what bounds this memory.
  int max_pending = 1024;         // streams without hello, in all
  int max_pending_per_peer = 64;  // ... from one peer host
};

class PendingSessions {
 public:
  class Wait;

  // `on_expired` (may be empty) counts each stream ended for its silence.
  explicit PendingSessions(PendingLimits limits, std::function<void()> on_expired = {});
  ~PendingSessions();
  PendingSessions(const PendingSessions&) = delete;
  PendingSessions& operator=(const PendingSessions&) = delete;

  // A wait for the hello of a new stream from `peer` (gRPC's peer string;
  // the host part is what the per-peer cap counts), or RESOURCE_EXHAUSTED
  // naming the cap. `expire` ends the stream; it is called at most once.
  absl::StatusOr<std::shared_ptr<Wait>> Admit(const std::string& peer,
                                              std::function<void()> expire);

  // Streams waiting for their hello now.
  int pending() const;

  // The host part of a gRPC peer ("ipv4:10.0.0.5:41234" -> "ipv4:10.0.0.5").
  static std::string PeerHost(const std::string& peer);

 private:
  struct Entry {
    std::weak_ptr<Wait> wait;
    std::string host;
    absl::Time deadline;
  };
  void Remove(uint64_t id);
  void Loop();

  const PendingLimits limits_;
  const std::function<void()> on_expired_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> per_host_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;
};

class PendingSessions::Wait {
 public:
  // The hello came: true when in time (the stream goes on, the registry
  // lets go of it); false when the deadline already ended the stream.
  bool Greeted();
  // The stream ended (OnDone) before its hello.
  void Gone();

 private:
  friend class PendingSessions;
  enum class State { kWaiting, kGreeted, kExpired, kGone };
  Wait(PendingSessions* owner, uint64_t id, std::function<void()> expire)
      : owner_(owner), id_(id), expire_(std::move(expire)) {}
  // From the reaper: ends a stream still waiting; true when it did.
  bool Expire();
  // Leaves kWaiting for `to`; false when already settled.
  bool Settle(State to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  PendingSessions* const owner_;
  const uint64_t id_;
  const std::function<void()> expire_;
  absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kWaiting;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_PENDING_SESSIONS_H_
