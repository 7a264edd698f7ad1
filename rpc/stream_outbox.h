// StreamOutbox<In, Out>: the write side of one server bidi stream (the
// coordinator's Session and HostSession, the node relay's Session), or of a
// server-streaming one with Reactor = grpc::ServerWriteReactor<Out> (the
// coordinator's WatchReleased): a queue in front of the reactor's single
// outstanding write. Outlives the reactor
// (jobs and relays hold the sinks that use it), so every use checks that the
// reactor is still there.
//
// Thread-safety: every method may be called from any thread. StartWrite and
// Finish are called outside the outbox's lock because gRPC may run
// reactions inline. The reactor must forward OnWriteDone here and call
// Detach() from OnDone.
#ifndef DYNMO_RPC_STREAM_OUTBOX_H_
#define DYNMO_RPC_STREAM_OUTBOX_H_

#include <deque>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/server_callback.h"
#include "grpcpp/support/status.h"

namespace dynmo::rpc {

template <typename In, typename Out, typename R = grpc::ServerBidiReactor<In, Out>>
class StreamOutbox {
 public:
  using Reactor = R;

  explicit StreamOutbox(Reactor* reactor) : reactor_(reactor) {}

  // Queues `message`; starts writing when idle. Dropped once finishing.
  void Write(std::shared_ptr<const Out> message) {
    Reactor* start = nullptr;
    const Out* first = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (reactor_ == nullptr || finishing_) return;
      queue_.push_back(std::move(message));
      if (!writing_) {
        writing_ = true;
        start = reactor_;
        first = queue_.front().get();
      }
    }
    if (start != nullptr) start->StartWrite(first);
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
      queue_.pop_front();
      if (!ok) queue_.clear();  // the stream is broken: nothing more goes out
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

  // The reactor is gone (OnDone): drop everything from now on.
  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
    queue_.clear();
  }

 private:
  absl::Mutex mu_;
  Reactor* reactor_ ABSL_GUARDED_BY(mu_);
  // Front = the write in flight; shared_ptr keeps it alive until done.
  std::deque<std::shared_ptr<const Out>> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> pending_finish_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dynmo::rpc

#endif  // DYNMO_RPC_STREAM_OUTBOX_H_
