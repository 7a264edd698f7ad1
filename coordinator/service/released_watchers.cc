#include "coordinator/service/released_watchers.h"

#include <algorithm>
#include <atomic>
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
// notifier may wake it while the reactor is being torn down. Events are
// pulled from the pool's history: at most kWindowEvents wait in the outbox
// beyond the snapshot, and more are taken as writes complete, so what a
// slow reader costs is its cursor, not a copy of every event it has not
// read.
class ReleasedWatchers::Watch {
 public:
  Watch(ReleasedPool* pool, bool include_claimed, Reactor* reactor, rpc::OutboxBound backlog,
        const std::function<void()>* on_overflow)
      : pool_(pool),
        include_claimed_(include_claimed),
        max_lag_(backlog.max_messages),
        max_bytes_(backlog.max_bytes),
        on_overflow_(on_overflow),
        outbox_(reactor, rpc::OutboxBound{0, backlog.max_bytes, backlog.per_message_bytes}) {}

  // Starts writing: `snapshot` first, then the events after it.
  void Begin(std::shared_ptr<const Snapshot> snapshot) {
    {
      absl::MutexLock lock(&mu_);
      seq_ = snapshot->seq;
      snapshot_ = std::move(snapshot);
      begun_ = true;
    }
    Pump();
  }

  // Tops the outbox up from the pool's events after the last one queued.
  // Called by the notifier and after every completed write, possibly while
  // another thread is in here (or inline from a write this call started):
  // whoever holds the lock rechecks `wanted_` after releasing it, so no
  // wake-up is lost and the lock is never taken twice on one thread.
  void Pump() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    wanted_.store(true);
    while (wanted_.load()) {
      if (!mu_.TryLock()) return;  // the holder will see `wanted_`
      wanted_.store(false);
      if (begun_) FillLocked();
      mu_.Unlock();
    }
  }
  Outbox& outbox() { return outbox_; }

 private:
  static constexpr size_t kWindowEvents = 64;

  bool RoomLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return outbox_.waiting() < kWindowEvents &&
           (max_bytes_ == 0 || outbox_.waiting_bytes() < max_bytes_ / 2);
  }
  void FillLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ended_) return;
    while (snapshot_ != nullptr && RoomLocked()) {
      if (snapshot_at_ == snapshot_->messages.size()) {
        snapshot_.reset();  // written: the events after it follow
        break;
      }
      if (!outbox_.Write(snapshot_->messages[snapshot_at_++])) return Ended();
    }
    if (snapshot_ != nullptr) return;
    while (RoomLocked()) {
      if (const uint64_t last = pool_->LastSeq(); max_lag_ > 0 && last > seq_ + max_lag_) {
        FellBehindLocked(absl::StrCat("it is ", last - seq_,
                                      " events behind, beyond the server's bound of ", max_lag_,
                                      " (--watcher_backlog_events)"));
        return;
      }
      bool behind = false;
      std::vector<ReleasedPool::Event> events =
          pool_->EventsAfter(seq_, kWindowEvents - outbox_.waiting(), &behind);
      if (behind) {
        FellBehindLocked("the events after the last one it was sent are no longer kept");
        return;
      }
      if (events.empty()) return;
      for (ReleasedPool::Event& e : events) {
        seq_ = e.seq;
        if (!include_claimed_ && e.kind == ReleasedEvent::CLAIMED) continue;
        if (!Queue(e.encoded)) return;
      }
    }
  }
  // Ends the stream of a reader that fell behind, and counts it once.
  void FellBehindLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ended_ = true;
    outbox_.Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                "the client reads too slowly: " + why + "; reconnect and read"));
    Count();
  }
  // Queues one event; false once the stream is ending.
  bool Queue(const std::string& encoded) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    grpc::Slice slice(encoded);
    if (outbox_.Write(std::make_shared<const grpc::ByteBuffer>(&slice, 1))) return true;
    Ended();
    return false;
  }
  // The outbox refused a message: the stream is ending (counted when it
  // was for the byte bound).
  void Ended() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ended_ = true;
    snapshot_.reset();
    if (outbox_.overflowed()) Count();
  }
  void Count() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (counted_) return;
    counted_ = true;
    if (*on_overflow_) (*on_overflow_)();
  }

  ReleasedPool* const pool_;
  const bool include_claimed_;
  const size_t max_lag_;
  const size_t max_bytes_;
  const std::function<void()>* const on_overflow_;
  std::atomic<bool> wanted_{false};
  absl::Mutex mu_;
  bool counted_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<const Snapshot> snapshot_ ABSL_GUARDED_BY(mu_);
  size_t snapshot_at_ ABSL_GUARDED_BY(mu_) = 0;
  bool begun_ ABSL_GUARDED_BY(mu_) = false;
  Outbox outbox_;
};

class ReleasedWatchers::Stream final : public Reactor {
 public:
  explicit Stream(ReleasedWatchers* owner) : owner_(owner) {}
  void Bind(std::shared_ptr<Watch> watch) { watch_ = std::move(watch); }

  void OnWriteDone(bool ok) override {
    watch_->outbox().OnWriteDone(ok);
    if (!ok) {
      watch_->outbox().Finish(grpc::Status::OK);  // the client is gone
      return;
    }
    watch_->Pump();  // the next events, from the pool's history
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
  pool_->AddWatcher();  // the pool keeps its events from before the snapshot on
  watch->Begin(SnapshotNow(include_claimed));
  return stream;
}

std::shared_ptr<const ReleasedWatchers::Snapshot> ReleasedWatchers::SnapshotNow(
    bool include_claimed) {
  absl::MutexLock lock(&snapshot_mu_);
  std::weak_ptr<const Snapshot>& cached = snapshots_[include_claimed ? 1 : 0];
  const uint64_t seq = pool_->LastSeq();
  if (auto s = cached.lock(); s != nullptr && s->seq == seq) return s;
  auto s = std::make_shared<Snapshot>();
  s->seq = seq;  // read before the list: an event in between is sent twice, never lost
  for (dynmo::v1::ReleasedGpu& g : pool_->List("", include_claimed)) {
    ReleasedEvent e;
    e.set_kind(ReleasedEvent::SNAPSHOT);
    *e.mutable_gpu() = std::move(g);
    s->messages.push_back(Encoded(e));
  }
  cached = s;
  return s;
}

void ReleasedWatchers::Remove(const Watch* watch) {
  size_t removed;
  {
    absl::MutexLock lock(&mu_);
    const auto gone =
        std::remove_if(watches_.begin(), watches_.end(),
                       [&](const std::shared_ptr<Watch>& w) { return w.get() == watch; });
    removed = static_cast<size_t>(watches_.end() - gone);
    watches_.erase(gone, watches_.end());
  }
  for (size_t i = 0; i < removed; ++i) pool_->RemoveWatcher();
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
    const uint64_t last = pool_->WaitPast(seen, absl::Seconds(1));  // or Stop's WakeAll
    if (last == seen) continue;
    seen = last;
    std::vector<std::shared_ptr<Watch>> watches;
    {
      absl::MutexLock lock(&mu_);
      watches = watches_;
    }
    for (const auto& w : watches) w->Pump();
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
