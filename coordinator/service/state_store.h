// StateStore: the coordinator's durable state in --state_dir as one file per
// record, so a commit writes what changed and nothing else:
//   <dir>/jobs/<job name>.pb   one dynmo.v1.JobRecord per job
//   <dir>/pool.pb              the released-GPU pool and the next GPU id (a
//                              dynmo.v1.CoordinatorState without jobs)
// Each file is framed with a checksum (record_file.h) and replaced
// atomically: a temp file beside it (<file>.tmp),
// fsync, rename over the old one, fsync the folder. After a crash (kill -9,
// power loss) each file is its old or its new version, never a torn one.
// Records are independent (a job's epoch, layout and owner live in its file
// alone), so a set of files is always a consistent state.
// A state dir of an older coordinator holds one snapshot, <dir>/state.pb:
// Load reads it, and while it exists it wins over any record files (a crash
// in the middle of a migration re-runs it); Save(state) writes every record,
// removes record files of jobs the state lacks, then removes state.pb.
// Job names reach the file system only as validated names ([A-Za-z0-9._-],
// 1-128 characters: coordinator/job/validation.h); another name is refused.
//
// StateKeeper sits on top: a job or the released pool commits its new
// record (CommitJob / CommitPool / RemoveJob), which writes that record's
// file before returning. Callers commit BEFORE they act on a change (send a
// plan, answer a claim), which is what makes epochs and pool records survive
// kill -9. A commit that fails leaves the keeper as it was after the last
// good one, so a change its caller refused (and rolled back) is never
// written by a later commit; each failure is counted and handed to the
// failure hook. A failed write leaves no temp file behind.
// An empty directory path disables persistence (commits only count).
//
// Read-only mode: a state dir that cannot be written (a full disk, a
// read-only mount, no write permission) with records that read back does
// not stop the coordinator. The keeper opens read-only, every commit is
// refused with UNAVAILABLE (nothing changes, as with any failed commit),
// and each commit — and Probe, which the coordinator calls every few
// seconds — tries the disk again; the first write that succeeds ends the
// mode. The mode hook hears each change of mode once. An old snapshot that
// could not be migrated at Open is migrated by the first write that works.
// StateKeeper is thread-safe; lock order is caller's lock -> keeper's lock.
#ifndef DYNMO_COORDINATOR_SERVICE_STATE_STORE_H_
#define DYNMO_COORDINATOR_SERVICE_STATE_STORE_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/job/job_journal.h"
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
  // The lock is bound to that directory: when the path names another one
  // later (the folder swapped or removed under the running daemon), every
  // write is FAILED_PRECONDITION (the keeper turns read-only) instead of
  // writing into a directory it never locked.
  // A directory that exists but cannot be written opens read-only (a read
  // lock where the LOCK file can be read): writable() says which, and why.
  absl::Status Open();
  // The whole state: the old snapshot when there is one (legacy() then
  // says so), else the pool file and every job file, jobs by name; nullopt
  // when the directory holds neither. A snapshot or pool file that fails
  // its checksum or does not parse is DATA_LOSS naming the file. A job
  // file that cannot be read, fails its checksum, does not parse or names
  // another job is left out and listed in bad_records(): one job's bad
  // record never stops the others.
  absl::StatusOr<std::optional<dynmo::v1::CoordinatorState>> Load();
  // The job files the last Load left out, each with why (DATA_LOSS).
  struct BadRecord {
    std::string job;
    std::string path;
    absl::Status why;
  };
  const std::vector<BadRecord>& bad_records() const { return bad_records_; }
  // Renames a job's file to <file>.quarantined (kept for a post-mortem, no
  // longer a record); OK when there is none.
  absl::Status SetAsideJob(const std::string& name);
  // Whether the last Load read an old single-file snapshot (state.pb).
  bool legacy() const { return legacy_; }

  // Replaces one job's file.
  absl::Status SaveJob(const dynmo::v1::JobRecord& job);
  // Removes one job's file (OK when there is none).
  absl::Status RemoveJob(const std::string& name);
  // Replaces the pool file: the released GPUs, the next GPU id and the
  // commit count.
  absl::Status SavePool(uint64_t generation, uint64_t next_gpu_id,
                        const std::vector<dynmo::v1::ReleasedGpu>& pool);
  // Writes the whole state: every job's file, the pool file; removes the
  // files of jobs `state` lacks and the old snapshot, in that order.
  absl::Status Save(const dynmo::v1::CoordinatorState& state);

  // Whether Open found the directory writable; else `why_read_only()`.
  bool writable() const { return write_locked_; }
  const std::string& why_read_only() const { return why_read_only_; }

  std::string legacy_path() const { return dir_ + "/state.pb"; }
  std::string pool_path() const { return dir_ + "/pool.pb"; }
  std::string jobs_dir() const { return dir_ + "/jobs"; }
  // <dir>/jobs/<name>.pb (the name is not checked here).
  std::string job_path(const std::string& name) const {
    return jobs_dir() + "/" + name + ".pb";
  }

 private:
  // Takes the LOCK file's write lock (FAILED_PRECONDITION when another
  // process holds it).
  absl::Status LockForWrite();
  // The LOCK file's read lock, when it exists and can be read.
  absl::Status LockForRead();
  // The write lock (when the store opened read-only) and the jobs folder.
  absl::Status ReadyToWrite();
  // One job's record: NOT_FOUND when its file is gone, DATA_LOSS naming
  // the file when it is unusable.
  absl::StatusOr<dynmo::v1::JobRecord> LoadJob(const std::string& name) const;

  std::string dir_;
  // The directory Open found and locked (device, inode): every write
  // checks that the path still names it.
  std::optional<std::pair<dev_t, ino_t>> dir_id_;
  int lock_fd_ = -1;
  bool write_locked_ = false;
  bool legacy_ = false;
  std::vector<BadRecord> bad_records_;
  std::string why_read_only_;
};

class StateKeeper : public JobJournal {
 public:
  // `dir` empty: in-memory only.
  explicit StateKeeper(std::string dir);

  // Opens the store and returns what it held (an empty state when new).
  absl::StatusOr<dynmo::v1::CoordinatorState> Open();

  // Writes `job`'s record file (or the pool's) with it as the new record; on
  // an error nothing changes.
  // The job machines' journal (job/job_journal.h).
  absl::Status CommitJob(const dynmo::v1::JobRecord& job) override;
  absl::Status CommitPool(const std::vector<dynmo::v1::ReleasedGpu>& pool,
                          uint64_t next_gpu_id);
  // Removes the record file of the job `name` (a deleted job).
  absl::Status RemoveJob(const std::string& name);
  // Sets a quarantined job's file aside (StateStore::SetAsideJob).
  absl::Status SetAsideJob(const std::string& name);
  // The job files Open left out as unusable (StateStore::bad_records).
  std::vector<StateStore::BadRecord> bad_records() const;
  // The file of job `name`'s record (StateStore::job_path).
  std::string job_path(const std::string& name) const { return store_.job_path(name); }

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
  // In read-only mode, writes the pool's record again (and migrates an old
  // snapshot still waiting); OK when the state dir takes writes (then the
  // mode ends). A no-op otherwise.
  absl::Status Probe();
  // True while commits are refused because the state dir cannot be written.
  bool read_only() const;

  bool durable() const { return !dir_.empty(); }
  uint64_t commits() const;
  uint64_t failures() const;

 private:
  // One commit: an old snapshot's migration first, then `write` (skipped
  // when not durable); on success `staged` takes the change into memory.
  // Both run under the keeper's lock.
  absl::Status Commit(const std::function<absl::Status()>& write,
                      const std::function<void()>& staged);
  // The refusal every failed write turns into (read-only mode starts).
  absl::Status Refused(const absl::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the whole staged state when an old snapshot still waits to be
  // migrated (OK and nothing written otherwise).
  absl::Status MigrateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A commit's write done: on success ++generation_ and read-only mode ends
  // (the caller then stages its change); a failure is Refused.
  absl::Status Written(absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands a failure to the failure hook and a change of mode to the mode
  // hook (outside the lock); returns `s`.
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
  bool migrate_ ABSL_GUARDED_BY(mu_) = false;  // an old snapshot awaits its records
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_STATE_STORE_H_
