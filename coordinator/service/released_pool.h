// ReleasedPool: the GPUs that re-packing released, with their claim state.
// A GPU record (dynmo.v1.ReleasedGpu) is FREE until a scheduler claims it
// under a lease (holder + seconds); a claim by another holder succeeds only
// after the lease has expired; Return by the holder frees it again. Claim
// and Return are all-or-nothing. Every change is committed to the
// StateKeeper before it is visible or answered, so kill -9 loses no record.
// Add is idempotent per (job, epoch, rank), which makes re-applying a plan
// after a restart harmless. Thread-safe; lock order: pool -> keeper.
#ifndef DYNMO_COORDINATOR_SERVICE_RELEASED_POOL_H_
#define DYNMO_COORDINATOR_SERVICE_RELEASED_POOL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "coordinator/service/state_store.h"
#include "dynmo/v1/scheduler.pb.h"

namespace dynmo::service {

class ReleasedPool {
 public:
  explicit ReleasedPool(StateKeeper* keeper) : keeper_(keeper) {}

  // Loads the records of a snapshot (called once, before serving).
  void Restore(const dynmo::v1::CoordinatorState& state);

  // Adds newly released GPUs (ids are assigned here) and commits.
  absl::Status Add(std::vector<dynmo::v1::ReleasedGpu> gpus);

  std::vector<dynmo::v1::ReleasedGpu> List(const std::string& job,
                                           bool include_claimed) const;

  absl::StatusOr<std::vector<dynmo::v1::ReleasedGpu>> Claim(
      absl::Span<const std::string> ids, const std::string& holder,
      int64_t lease_seconds, absl::Time now);

  absl::StatusOr<std::vector<dynmo::v1::ReleasedGpu>> Return(
      absl::Span<const std::string> ids, const std::string& holder);

  // Events for WatchReleased, kept encoded (a dynmo.v1.ReleasedEvent) so
  // that the history is small and every watcher writes the same bytes.
  // Sequence numbers start at 1 and are consecutive.
  struct Event {
    uint64_t seq = 0;
    dynmo::v1::ReleasedEvent::Kind kind = dynmo::v1::ReleasedEvent::KIND_UNSPECIFIED;
    std::string encoded;
  };
  // Waits up to `timeout` for an event after `after` (or WakeAll); returns
  // the last sequence number.
  uint64_t WaitPast(uint64_t after, absl::Duration timeout) const;
  uint64_t LastSeq() const;
  // At most `max` events after `after`, at once, in order. `behind` is set
  // when the event right after `after` is no longer kept (the history holds
  // the last 4,096): the caller fell behind and cannot catch up from events.
  std::vector<Event> EventsAfter(uint64_t after, size_t max, bool* behind) const;
  // The history is kept only while a watcher may read it: between a
  // watcher's AddWatcher (called before it reads LastSeq for its snapshot)
  // and its RemoveWatcher. Without one, events are numbered and not kept;
  // when the last one leaves the history is dropped and the allocator is
  // asked to return the free memory to the system, so a burst of watched
  // traffic leaves nothing behind once its watchers are gone.
  void AddWatcher();
  void RemoveWatcher();
  // Wakes every WaitPast (shutdown).
  void WakeAll();

 private:
  void RecordLocked(dynmo::v1::ReleasedEvent::Kind kind,
                    const dynmo::v1::ReleasedGpu& gpu)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CommitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies `change` to the GPUs at `index`, persists, records `kind` events
  // and returns the changed records; on a failed commit nothing changes.
  absl::StatusOr<std::vector<dynmo::v1::ReleasedGpu>> UpdateLocked(
      const std::vector<size_t>& index, dynmo::v1::ReleasedEvent::Kind kind,
      const std::function<void(dynmo::v1::ReleasedGpu&)>& change)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Position of GPU `id` in gpus_, or gpus_.size() when unknown.
  size_t IndexOfLocked(const std::string& id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  StateKeeper* keeper_;
  mutable absl::Mutex mu_;
  std::vector<dynmo::v1::ReleasedGpu> gpus_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<Event> events_ ABSL_GUARDED_BY(mu_);
  uint64_t last_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t wake_ ABSL_GUARDED_BY(mu_) = 0;
  int watchers_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_RELEASED_POOL_H_
