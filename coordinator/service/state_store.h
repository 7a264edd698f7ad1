// StateStore: the coordinator's durable state as one atomic snapshot file,
// <dir>/state.pb (a dynmo.v1.CoordinatorState). Save writes a temp file,
// fsyncs it, renames it over the old snapshot and fsyncs the directory, so
// after a crash (kill -9, power loss) the file is either the old or the new
// snapshot, never a torn one.
//
// StateKeeper sits on top: a job or the released pool commits its new
// record (CommitJob / CommitPool), which writes the whole snapshot before
// returning. Callers commit BEFORE they act on a change (send a plan, answer
// a claim), which is what makes epochs and pool records survive kill -9.
// A commit that fails leaves the keeper as it was after the last good one,
// so a change its caller refused (and rolled back) is never written by a
// later commit; each failure is counted and handed to the failure hook.
// A failed write leaves no temp file behind.
// An empty directory path disables persistence (commits only count).
//
// Read-only mode: a state dir that cannot be written (a full disk, a
// read-only mount, no write permission) with a snapshot that reads back
// does not stop the coordinator. The keeper opens read-only, every commit
// is refused with UNAVAILABLE (nothing changes, as with any failed commit),
// and each commit — and Probe, which the coordinator calls every few
// seconds — tries the disk again; the first write that succeeds ends the
// mode. The mode hook hears each change of mode once.
// StateKeeper is thread-safe; lock order is caller's lock -> keeper's lock.
#ifndef DYNMO_COORDINATOR_SERVICE_STATE_STORE_H_
#define DYNMO_COORDINATOR_SERVICE_STATE_STORE_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "dynmo/v1/state.pb.h"

namespace dynmo::service {

class StateStore {
 public:
  explicit StateStore(std::string dir) : dir_(std::move(dir)) {}
  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  // Creates the directory if needed and takes its LOCK file (a POSIX lock,
  // held until destruction): a second dynmo-coordinator process on the same
  // directory gets FAILED_PRECONDITION instead of two writers of one state.
  // A directory that exists but cannot be written opens read-only (a read
  // lock where the LOCK file can be read): writable() says which, and why.
  absl::Status Open();
  // Returns the newest snapshot, or nullopt when none was ever written.
  absl::StatusOr<std::optional<dynmo::v1::CoordinatorState>> Load() const;
  // Atomically replaces the snapshot; takes the write lock first when the
  // store opened read-only.
  absl::Status Save(const dynmo::v1::CoordinatorState& state);

  // Whether Open found the directory writable; else `why_read_only()`.
  bool writable() const { return write_locked_; }
  const std::string& why_read_only() const { return why_read_only_; }

  std::string path() const { return dir_ + "/state.pb"; }

 private:
  // Takes the LOCK file's write lock (FAILED_PRECONDITION when another
  // process holds it).
  absl::Status LockForWrite();
  // The LOCK file's read lock, when it exists and can be read.
  absl::Status LockForRead();

  std::string dir_;
  int lock_fd_ = -1;
  bool write_locked_ = false;
  std::string why_read_only_;
};

class StateKeeper {
 public:
  // `dir` empty: in-memory only.
  explicit StateKeeper(std::string dir);

  // Opens the store and returns what it held (an empty state when new).
  absl::StatusOr<dynmo::v1::CoordinatorState> Open();

  // Writes the snapshot with `job` (or the pool) as its new record; on an
  // error nothing changes.
  absl::Status CommitJob(const dynmo::v1::JobRecord& job);
  absl::Status CommitPool(const std::vector<dynmo::v1::ReleasedGpu>& pool,
                          uint64_t next_gpu_id);
  // Writes the snapshot without the job `name` (a deleted job).
  absl::Status RemoveJob(const std::string& name);

  // Called (outside the keeper's lock) with each failed commit's error:
  // the coordinator counts it in /metrics. Set before use.
  void SetFailureHook(std::function<void(const absl::Status&)> hook) {
    on_failure_ = std::move(hook);
  }
  // Called (outside the keeper's lock) once per change of mode: false and
  // why when the state dir stops taking writes (at Open or at a failed
  // commit), true when a write succeeds again. Set before Open.
  void SetModeHook(std::function<void(bool writable, const absl::Status& why)> hook) {
    on_mode_ = std::move(hook);
  }
  // In read-only mode, writes the staged state again; OK when the state dir
  // takes writes (then the mode ends). A no-op otherwise.
  absl::Status Probe();
  // True while commits are refused because the state dir cannot be written.
  bool read_only() const;

  bool durable() const { return !dir_.empty(); }
  uint64_t commits() const;
  uint64_t failures() const;

 private:
  // Writes the snapshot of the staged records; on failure restores them
  // from the last good snapshot and returns the error.
  absl::Status CommitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Report(absl::Status s, bool mode_changed);

  std::string dir_;
  StateStore store_;
  std::function<void(const absl::Status&)> on_failure_;
  std::function<void(bool, const absl::Status&)> on_mode_;
  mutable absl::Mutex mu_;
  std::map<std::string, dynmo::v1::JobRecord> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<dynmo::v1::ReleasedGpu> pool_ ABSL_GUARDED_BY(mu_);
  uint64_t next_gpu_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
  bool read_only_ ABSL_GUARDED_BY(mu_) = false;
  dynmo::v1::CoordinatorState saved_ ABSL_GUARDED_BY(mu_);  // last good one
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_STATE_STORE_H_
