// ReleasedWatchers: the WatchReleased streams of one coordinator, served on
// the gRPC callback API without a thread each. Each stream is a write
// reactor with its own queue (rpc/stream_outbox.h) and a cursor into the
// released pool's event history; one notifier thread waits for the pool's
// next event and wakes every stream, which then queues the events after its
// cursor, at most a small window at a time, and takes the next ones as its
// writes complete; the snapshot is encoded once and shared by the streams
// that open at the same point, and written through the same window. A slow
// reader so costs that window and its cursors, not a copy of every GPU and
// event it has not read. A reader that falls behind by more
// than `backlog.max_messages` events, or behind the pool's history, is ended
// with RESOURCE_EXHAUSTED and counted (`on_overflow`); it reconnects and
// starts from a snapshot. The window is at most 64 events and half of
// `backlog.max_bytes` (each event counted as its encoding plus
// kEventOverheadBytes, what holding it costs the process). At most `max_watchers` streams are open at once;
// Open beyond that answers RESOURCE_EXHAUSTED.
//
// Thread-safe. Lock order: a stream's lock -> its outbox's -> the pool's;
// the registry's lock is never held while a stream is woken or finished.
#ifndef DYNMO_COORDINATOR_SERVICE_RELEASED_WATCHERS_H_
#define DYNMO_COORDINATOR_SERVICE_RELEASED_WATCHERS_H_

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/service/released_pool.h"
#include "dynmo/v1/scheduler.pb.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "grpcpp/support/status.h"
#include "rpc/stream_outbox.h"

namespace dynmo::service {

class ReleasedWatchers {
 public:
  // What holding one queued event costs beyond its encoding (a ByteBuffer,
  // its slice, a shared_ptr, a queue entry), measured: ~320 bytes.
  static constexpr size_t kEventOverheadBytes = 256;

  // `pool` (not owned) outlives this. Starts the notifier thread.
  // `on_overflow` (may be empty) is called once per stream ended for its
  // backlog, from the notifier thread or Open's.
  ReleasedWatchers(ReleasedPool* pool, int max_watchers, rpc::OutboxBound backlog = {},
                   std::function<void()> on_overflow = {});
  ~ReleasedWatchers();
  ReleasedWatchers(const ReleasedWatchers&) = delete;
  ReleasedWatchers& operator=(const ReleasedWatchers&) = delete;

  // A WatchReleased stream writes encoded dynmo.v1.ReleasedEvent messages
  // (the service takes raw bytes: scheduler_service.h).
  using Reactor = grpc::ServerWriteReactor<grpc::ByteBuffer>;

  // A reactor for one WatchReleased call: the pool's snapshot, then its
  // events as they happen, CLAIMED ones only with `include_claimed`. Ends
  // when the client cancels or Stop is called. Beyond the cap, or after
  // Stop, a reactor that finishes at once with RESOURCE_EXHAUSTED
  // (UNAVAILABLE after Stop).
  Reactor* Open(bool include_claimed);
  // A reactor that finishes at once with `status` (a refused call).
  static Reactor* Refused(const grpc::Status& status);

  // Finishes every open stream (OK) and ends the notifier. Idempotent.
  void Stop();

  // Streams open now.
  int open() const;

 private:
  class Watch;
  class Stream;
  // The pool's GPUs as SNAPSHOT events, encoded once and shared by every
  // stream that opens while the pool stays at `seq`.
  struct Snapshot {
    uint64_t seq = 0;
    std::vector<std::shared_ptr<const grpc::ByteBuffer>> messages;
  };
  std::shared_ptr<const Snapshot> SnapshotNow(bool include_claimed);
  void Loop();
  void Remove(const Watch* watch);

  ReleasedPool* const pool_;
  const int max_watchers_;
  const rpc::OutboxBound backlog_;
  const std::function<void()> on_overflow_;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<Watch>> watches_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex snapshot_mu_;
  // Held by the streams still writing them: gone once none is.
  std::weak_ptr<const Snapshot> snapshots_[2] ABSL_GUARDED_BY(snapshot_mu_);
  std::thread notifier_;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_RELEASED_WATCHERS_H_
