// JobRegistry: the coordinator's jobs by name. A job is created by the first
// rank that registers with a new name (or restored from the state dir) and
// lives until it is deleted (an operator's DeleteJob, or idle past the
// coordinator's expiry). A deleted job of a named owner leaves a tombstone:
// its name stays the owner's (no other principal may register it) until
// the owner's side or an admin releases it. A job whose stored record is
// unusable (a bad checksum, a parse failure, values out of bounds) is
// quarantined: every call naming it is DATA_LOSS naming the file, every
// other job is served. Thread-safe; the registry's lock is only held to
// look a job up, never while a job does work.
#ifndef DYNMO_COORDINATOR_SERVICE_JOB_REGISTRY_H_
#define DYNMO_COORDINATOR_SERVICE_JOB_REGISTRY_H_

#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/service/job_state.h"
#include "coordinator/service/state_store.h"

namespace dynmo::service {

// The operator's bounds on what registrations may cost (dynmo-coordinator
// --max_jobs, --max_jobs_per_principal, --max_ranks_per_job, --max_layers).
// They apply with or without principals: a job's memory and its record grow
// with its ranks and layers (docs/operations.md has the figures).
struct JobLimits {
  int max_jobs = 1024;
  int max_jobs_per_owner = 0;  // > 0: caps the jobs one named principal creates
  int max_ranks_per_job = 2048;  // pipeline_size x data_parallel_size
  int max_layers = 1024;
  // data_parallel_size x num_layers: the cost profile keeps one estimate
  // per (replica, layer), the largest part of a wide job's memory.
  int64_t max_replica_layers = 8192;
};

class JobRegistry {
 public:
  JobRegistry(const JobOptions& options, JobDeps deps, const JobLimits& limits)
      : options_(options), deps_(deps), limits_(limits) {}

  // Recreates the jobs of a snapshot (once, before serving): each record
  // validated like a registration (record_validation.h) and against the
  // limits; a record that fails, and each of `bad` (files the store could
  // not use), quarantines its job.
  void Restore(const dynmo::v1::CoordinatorState& state,
               const std::vector<StateStore::BadRecord>& bad = {});
  // Jobs quarantined now.
  int quarantined() const;
  // The owner a deleted job's name is kept for, or nullopt.
  std::optional<std::string> TombstoneOwner(const std::string& name) const;

  // Validates the request, creates the job on first sight (owned by
  // `caller`, a named principal or empty), registers the rank. A new job's
  // record, owner included, is committed to the state keeper before this
  // returns OK (UNAVAILABLE, and no job, when it cannot be), so no restart
  // lets another principal take it.
  // RESOURCE_EXHAUSTED when the job limit (or the caller's) is reached, or
  // the job's shape exceeds JobLimits' ranks or layers; PERMISSION_DENIED
  // for a named caller in another principal's job.
  absl::StatusOr<std::shared_ptr<JobState>> Register(
      const dynmo::v1::RegisterRequest& request,
      dynmo::v1::RegisterResponse* response, const std::string& caller = "");

  // RegisterHost: validates the whole request first (ValidateRegisterHost),
  // creates the job on first sight, registers every rank or none.
  absl::StatusOr<std::shared_ptr<JobState>> RegisterHost(
      const dynmo::v1::RegisterHostRequest& request,
      dynmo::v1::RegisterHostResponse* response, const std::string& caller = "");

  // NOT_FOUND names the job.
  absl::StatusOr<std::shared_ptr<JobState>> Find(const std::string& name) const;
  // Find for a caller acting in the job (a Session's or HostSession's
  // hello): PERMISSION_DENIED when `caller` (a named principal; empty:
  // unnamed) is not the job's owner.
  absl::StatusOr<std::shared_ptr<JobState>> FindFor(const std::string& name,
                                                    const std::string& caller) const;

  std::vector<std::shared_ptr<JobState>> All() const;

  // Deletes a job (JobState::Close, then its record leaves the state dir,
  // or becomes a tombstone when the job has a named owner and not
  // `release_name`). NOT_FOUND for an unknown job; FAILED_PRECONDITION while
  // ranks are connected and not `force`; a state dir that cannot be written
  // keeps the job as it was (UNAVAILABLE). A quarantined job's file is set
  // aside; a tombstone alone is removed with `release_name`. Returns the
  // sessions it ended.
  absl::StatusOr<int> Delete(const std::string& name, bool force,
                             bool release_name = false);
  // Deletes the jobs idle (no connected rank, no registration, report or
  // ack) since before now - `idle`; returns their names.
  std::vector<std::string> ExpireIdle(absl::Time now, absl::Duration idle);

 private:
  // RESOURCE_EXHAUSTED, naming the flag, for a shape beyond the limits.
  absl::Status CheckShape(const dynmo::v1::RegisterRequest& r) const;
  absl::StatusOr<std::shared_ptr<JobState>> FindOrCreate(
      const dynmo::v1::RegisterRequest& first, const std::string& caller);
  void QuarantineLocked(const std::string& name, const std::string& path,
                        const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The quarantined-jobs gauge, set to what quarantined_ holds now.
  void PublishQuarantinedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes a deleted job's record, or writes its tombstone.
  absl::Status ForgetLocked(const std::string& name, const std::string& owner,
                            bool release_name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const JobOptions options_;
  const JobDeps deps_;
  const JobLimits limits_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<JobState>> jobs_ ABSL_GUARDED_BY(mu_);
  // Quarantined job -> the DATA_LOSS every call naming it gets.
  std::map<std::string, absl::Status> quarantined_ ABSL_GUARDED_BY(mu_);
  // Deleted job -> the owner its name is kept for.
  std::map<std::string, std::string> tombstones_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_JOB_REGISTRY_H_
