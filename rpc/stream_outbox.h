// StreamOutbox<In, Out>: the write side of one server bidi stream (the
// coordinator's Session and HostSession, the node relay's Session), or of a
// server-streaming one with Reactor = grpc::ServerWriteReactor<Out> (the
// coordinator's WatchReleased): a queue in front of the reactor's single
// outstanding write. Outlives the reactor
// (jobs and relays hold the sinks that use it), so every use checks that the
// reactor is still there.
//
// A bound (OutboxBound) caps what waits to be written, in messages and in
// bytes: a client that stops reading (grants no HTTP/2 window) fills it
// and its stream is ended with RESOURCE_EXHAUSTED, the queue dropped, so a
// reader that never reads cannot grow the server. No bound by default.
//
// Thread-safety: every method may be called from any thread. StartWrite and
// Finish are called outside the outbox's lock because gRPC may run
// reactions inline. The reactor must forward OnWriteDone here and call
// Detach() from OnDone.
#ifndef DYNMO_RPC_STREAM_OUTBOX_H_
#define DYNMO_RPC_STREAM_OUTBOX_H_

#include <cstddef>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "grpcpp/support/status.h"

namespace dynmo::rpc {

// What may wait in one outbox; 0: no bound. Each message counts its
// encoding plus `per_message_bytes` (what holding it costs beyond that).
struct OutboxBound {
  size_t max_messages = 0;
  size_t max_bytes = 0;
  size_t per_message_bytes = 0;
};

// A queued message's size: a raw stream's bytes, a protobuf's encoding.
inline size_t QueuedBytes(const grpc::ByteBuffer& b) { return b.Length(); }
template <typename M>
size_t QueuedBytes(const M& m) { return m.ByteSizeLong(); }

template <typename In, typename Out, typename R = grpc::ServerBidiReactor<In, Out>>
class StreamOutbox {
 public:
  using Reactor = R;

  explicit StreamOutbox(Reactor* reactor, OutboxBound bound = {})
      : bound_(bound), reactor_(reactor) {}

  // Queues `message`; starts writing when idle. Dropped once finishing.
  // Beyond the bound the stream ends with RESOURCE_EXHAUSTED instead
  // (overflowed() then says so). False when `message` was dropped.
  bool Write(std::shared_ptr<const Out> message) {
    Reactor* start = nullptr;
    const Out* first = nullptr;
    Reactor* finish_now = nullptr;
    std::optional<grpc::Status> overflow;
    {
      absl::MutexLock lock(&mu_);
      if (reactor_ == nullptr || finishing_) return false;
      const size_t bytes = Cost(*message);
      if ((bound_.max_messages > 0 && queue_.size() >= bound_.max_messages) ||
          (bound_.max_bytes > 0 && queued_bytes_ + bytes > bound_.max_bytes)) {
        overflow = OverflowLocked(&finish_now);
      } else {
        queued_bytes_ += bytes;
        queue_.push_back(std::move(message));
        if (!writing_) {
          writing_ = true;
          start = reactor_;
          first = queue_.front().get();
        }
      }
    }
    if (overflow) {
      if (finish_now != nullptr) finish_now->Finish(*overflow);  // nothing was in flight
      return false;
    }
    if (start != nullptr) start->StartWrite(first);
    return true;
  }

  // Ends the stream with `status` once the write in flight (if any) is done.
  void Finish(const grpc::Status& status) {
    Reactor* r = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (reactor_ == nullptr || finishing_) return;
      finishing_ = true;
      if (writing_) {
        pending_finish_ = status;  // after the write in flight completes
        return;
      }
      r = reactor_;
    }
    r->Finish(status);
  }

  void OnWriteDone(bool ok) {
    Reactor* r = nullptr;
    const Out* next = nullptr;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (!queue_.empty()) {
        queued_bytes_ -= Cost(*queue_.front());
        queue_.pop_front();
      }
      if (!ok) {  // the stream is broken: nothing more goes out
        queue_.clear();
        queued_bytes_ = 0;
      }
      if (!queue_.empty() && !(finishing_ && pending_finish_)) {
        next = queue_.front().get();
        r = reactor_;
      } else {
        writing_ = false;
        if (pending_finish_) {
          finish = pending_finish_;
          pending_finish_.reset();
          r = reactor_;
        }
      }
    }
    if (next != nullptr) {
      r->StartWrite(next);
    } else if (finish) {
      r->Finish(*finish);
    }
  }

  bool finishing() {
    absl::MutexLock lock(&mu_);
    return finishing_;
  }
  // Messages waiting, the write in flight included, and what they count
  // against the byte bound (0 without one).
  size_t waiting() {
    absl::MutexLock lock(&mu_);
    return queue_.size();
  }
  size_t waiting_bytes() {
    absl::MutexLock lock(&mu_);
    return queued_bytes_;
  }
  // Whether the stream was ended for a full outbox.
  bool overflowed() {
    absl::MutexLock lock(&mu_);
    return overflowed_;
  }

  // The reactor is gone (OnDone): drop everything from now on.
  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
    queue_.clear();
    queued_bytes_ = 0;
  }

 private:
  // The bound is reached: drop what waits (the write in flight excepted)
  // and finish with the returned RESOURCE_EXHAUSTED: after the write in
  // flight, or at once by the caller on `*finish_now` when none is.
  grpc::Status OverflowLocked(Reactor** finish_now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const grpc::Status status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        "the client reads too slowly: " + std::to_string(queue_.size()) + " messages (" +
            std::to_string(queued_bytes_) + " bytes) were waiting for it, beyond the " +
            "server's bound; reconnect and read");
    overflowed_ = true;
    finishing_ = true;
    if (writing_) {
      queued_bytes_ = Cost(*queue_.front());
      queue_.resize(1);  // the write in flight stays until it is done
      pending_finish_ = status;
      return status;
    }
    queue_.clear();
    queued_bytes_ = 0;
    *finish_now = reactor_;
    return status;
  }

  // What `m` counts against the byte bound (0 without one).
  size_t Cost(const Out& m) const {
    return bound_.max_bytes > 0 ? QueuedBytes(m) + bound_.per_message_bytes : 0;
  }

  const OutboxBound bound_;
  absl::Mutex mu_;
  Reactor* reactor_ ABSL_GUARDED_BY(mu_);
  // Front = the write in flight; shared_ptr keeps it alive until done.
  std::deque<std::shared_ptr<const Out>> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool overflowed_ ABSL_GUARDED_BY(mu_) = false;
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<grpc::Status> pending_finish_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dynmo::rpc

#endif  // DYNMO_RPC_STREAM_OUTBOX_H_
