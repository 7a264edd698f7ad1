#include "coordinator/service/released_watchers.h"

#include <algorithm>
#include <functional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/service/raw_message.h"
#include "rpc/stream_outbox.h"

namespace dynmo::service {

using dynmo::v1::ReleasedEvent;
using Reactor = ReleasedWatchers::Reactor;
using Outbox = rpc::StreamOutbox<grpc::ByteBuffer, grpc::ByteBuffer, Reactor>;

// One stream's state, shared by its reactor and the registry so that the
// notifier may wake it while the reactor is being torn down.
class ReleasedWatchers::Watch {
 public:
  Watch(ReleasedPool* pool, bool include_claimed, Reactor* reactor, rpc::OutboxBound backlog,
        const std::function<void()>* on_overflow)
      : pool_(pool), include_claimed_(include_claimed), on_overflow_(on_overflow),
        outbox_(reactor, backlog) {}

  // Queues the pool's snapshot: the first thing a stream writes.
  void Begin() {
    absl::MutexLock lock(&mu_);
    SnapshotLocked();
    begun_ = true;
  }
  // Queues the pool's events after the last one queued.
  void Wake() {
    absl::MutexLock lock(&mu_);
    if (!begun_) return;
    bool reset = false;
    std::vector<ReleasedPool::Event> events =
        pool_->WaitEvents(seq_, absl::ZeroDuration(), &reset);
    if (reset) {
      SnapshotLocked();
      return;
    }
    for (ReleasedPool::Event& e : events) {
      seq_ = e.seq;
      if (!include_claimed_ && e.event.kind() == ReleasedEvent::CLAIMED) continue;
      if (!Queue(e.event)) return;
    }
  }
  Outbox& outbox() { return outbox_; }

 private:
  void SnapshotLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    seq_ = pool_->LastSeq();
    for (dynmo::v1::ReleasedGpu& g : pool_->List("", include_claimed_)) {
      ReleasedEvent e;
      e.set_kind(ReleasedEvent::SNAPSHOT);
      *e.mutable_gpu() = std::move(g);
      if (!Queue(e)) return;
    }
  }
  // Queues one event; false once the stream is ending (a reader that fell
  // behind by the whole backlog is ended and counted, once).
  bool Queue(const ReleasedEvent& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (outbox_.Write(Encoded(e))) return true;
    if (!counted_ && outbox_.overflowed()) {
      counted_ = true;
      if (*on_overflow_) (*on_overflow_)();
    }
    return false;
  }

  ReleasedPool* const pool_;
  const bool include_claimed_;
  const std::function<void()>* const on_overflow_;
  absl::Mutex mu_;
  bool counted_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool begun_ ABSL_GUARDED_BY(mu_) = false;
  Outbox outbox_;
};

class ReleasedWatchers::Stream final : public Reactor {
 public:
  explicit Stream(ReleasedWatchers* owner) : owner_(owner) {}
  void Bind(std::shared_ptr<Watch> watch) { watch_ = std::move(watch); }

  void OnWriteDone(bool ok) override {
    watch_->outbox().OnWriteDone(ok);
    if (!ok) watch_->outbox().Finish(grpc::Status::OK);  // the client is gone
  }
  void OnCancel() override {
    watch_->outbox().Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }
  void OnDone() override {
    owner_->Remove(watch_.get());
    watch_->outbox().Detach();
    delete this;
  }

 private:
  ReleasedWatchers* const owner_;
  std::shared_ptr<Watch> watch_;
};

namespace {

class RefusedWatch final : public Reactor {
 public:
  explicit RefusedWatch(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

ReleasedWatchers::ReleasedWatchers(ReleasedPool* pool, int max_watchers,
                                   rpc::OutboxBound backlog, std::function<void()> on_overflow)
    : pool_(pool), max_watchers_(max_watchers), backlog_(backlog),
      on_overflow_(std::move(on_overflow)), notifier_([this] { Loop(); }) {}

ReleasedWatchers::~ReleasedWatchers() { Stop(); }

Reactor* ReleasedWatchers::Refused(const grpc::Status& status) {
  return new RefusedWatch(status);
}

Reactor* ReleasedWatchers::Open(bool include_claimed) {
  auto* stream = new Stream(this);
  auto watch = std::make_shared<Watch>(pool_, include_claimed, stream, backlog_, &on_overflow_);
  stream->Bind(watch);
  {
    absl::MutexLock lock(&mu_);
    if (stopped_ || static_cast<int>(watches_.size()) >= max_watchers_) {
      const bool stopped = stopped_;
      watch->outbox().Detach();
      delete stream;  // never started: gRPC has not seen it
      return Refused(
          stopped ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is stopping")
                  : grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                 absl::StrCat("the coordinator already serves ", max_watchers_,
                                              " WatchReleased streams (--max_watchers)")));
    }
    // Registered before the snapshot, so no event after it is missed.
    watches_.push_back(watch);
  }
  watch->Begin();
  return stream;
}

void ReleasedWatchers::Remove(const Watch* watch) {
  absl::MutexLock lock(&mu_);
  watches_.erase(std::remove_if(watches_.begin(), watches_.end(),
                                [&](const std::shared_ptr<Watch>& w) { return w.get() == watch; }),
                 watches_.end());
}

int ReleasedWatchers::open() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(watches_.size());
}

void ReleasedWatchers::Loop() {
  uint64_t seen = pool_->LastSeq();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return;
    }
    bool reset = false;
    pool_->WaitEvents(seen, absl::Seconds(1), &reset);  // or Stop's WakeAll
    const uint64_t last = pool_->LastSeq();
    if (last == seen) continue;
    seen = last;
    std::vector<std::shared_ptr<Watch>> watches;
    {
      absl::MutexLock lock(&mu_);
      watches = watches_;
    }
    for (const auto& w : watches) w->Wake();
  }
}

void ReleasedWatchers::Stop() {
  std::vector<std::shared_ptr<Watch>> watches;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    watches = watches_;
  }
  pool_->WakeAll();
  if (notifier_.joinable()) notifier_.join();
  for (const auto& w : watches) w->outbox().Finish(grpc::Status::OK);
}

}  // namespace dynmo::service
