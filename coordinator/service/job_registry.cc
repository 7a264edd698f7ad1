#include "coordinator/service/job_registry.h"

#include "absl/strings/str_cat.h"
#include "coordinator/service/event_log.h"
#include "coordinator/job/record_validation.h"
#include "coordinator/job/validation.h"

namespace dynmo::service {

void JobRegistry::Restore(const dynmo::v1::CoordinatorState& state,
                          const std::vector<StateStore::BadRecord>& bad) {
  absl::MutexLock lock(&mu_);
  for (const StateStore::BadRecord& b : bad) QuarantineLocked(b.job, b.path, b.why);
  for (const auto& record : state.jobs()) {
    absl::Status s = ValidateJobRecord(record);
    if (s.ok() && !record.tombstone()) s = CheckShape(RegistrationOf(record));
    if (!s.ok()) {
      QuarantineLocked(record.name(), deps_.keeper->job_path(record.name()), s);
      continue;
    }
    if (record.tombstone()) {
      tombstones_[record.name()] = record.owner();
      continue;
    }
    jobs_[record.name()] = std::make_shared<JobState>(record, options_, deps_);
  }
  PublishQuarantinedLocked();
}

void JobRegistry::PublishQuarantinedLocked() const {
  if (deps_.metrics != nullptr) {
    deps_.metrics->SetQuarantinedJobs(static_cast<int>(quarantined_.size()));
  }
}

void JobRegistry::QuarantineLocked(const std::string& name, const std::string& path,
                                   const absl::Status& why) {
  quarantined_[name] = absl::DataLossError(absl::StrCat(
      "job ", name, " is quarantined: its record ", path, " is unusable (", why.message(),
      "); its ranks are refused until the file is restored or an operator deletes the job "
      "(the file is then set aside as ", path, ".quarantined)"));
  LogEvent(LogLevel::kError, "record_quarantined",
           {{"job", name}, {"path", path}, {"error", why.message()}});
}

int JobRegistry::quarantined() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(quarantined_.size());
}

absl::StatusOr<std::shared_ptr<JobState>> JobRegistry::Register(
    const dynmo::v1::RegisterRequest& request,
    dynmo::v1::RegisterResponse* response, const std::string& caller) {
  if (absl::Status s = ValidateRegister(request); !s.ok()) return s;
  if (absl::Status s = CheckShape(request); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<JobState>> job = FindOrCreate(request, caller);
  if (!job.ok()) return job.status();
  if (absl::Status s = (*job)->Register(request, response); !s.ok()) return s;
  return job;
}

absl::StatusOr<std::shared_ptr<JobState>> JobRegistry::RegisterHost(
    const dynmo::v1::RegisterHostRequest& request,
    dynmo::v1::RegisterHostResponse* response, const std::string& caller) {
  if (absl::Status s = ValidateRegisterHost(request); !s.ok()) return s;
  if (absl::Status s = CheckShape(request.ranks(0)); !s.ok()) return s;
  // The request is consistent in itself, so a job it creates accepts it.
  absl::StatusOr<std::shared_ptr<JobState>> job = FindOrCreate(request.ranks(0), caller);
  if (!job.ok()) return job.status();
  std::vector<dynmo::v1::RegisterResponse> responses;
  if (absl::Status s = (*job)->RegisterMany(request.ranks(), &responses);
      !s.ok()) {
    return s;
  }
  for (auto& r : responses) *response->add_ranks() = std::move(r);
  return job;
}

absl::Status JobRegistry::CheckShape(const dynmo::v1::RegisterRequest& r) const {
  const int64_t ranks = static_cast<int64_t>(r.pipeline_size()) * r.data_parallel_size();
  if (ranks > limits_.max_ranks_per_job) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", r.job(), " has ", r.pipeline_size(), " x ", r.data_parallel_size(), " = ",
        ranks, " ranks; this coordinator serves at most ", limits_.max_ranks_per_job,
        " per job (--max_ranks_per_job)"));
  }
  if (r.num_layers() > limits_.max_layers) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", r.job(), " has ", r.num_layers(), " layers; this coordinator serves at most ",
        limits_.max_layers, " per job (--max_layers)"));
  }
  const int64_t replica_layers = static_cast<int64_t>(r.data_parallel_size()) * r.num_layers();
  if (replica_layers > limits_.max_replica_layers) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", r.job(), " has ", r.data_parallel_size(), " replicas x ", r.num_layers(),
        " layers = ", replica_layers, "; this coordinator serves at most ",
        limits_.max_replica_layers, " per job (--max_replica_layers)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<JobState>> JobRegistry::FindOrCreate(
    const dynmo::v1::RegisterRequest& first, const std::string& caller) {
  absl::MutexLock lock(&mu_);
  if (auto q = quarantined_.find(first.job()); q != quarantined_.end()) return q->second;
  auto it = jobs_.find(first.job());
  if (it != jobs_.end()) {
    const std::string& owner = it->second->owner();
    if (!caller.empty() && !owner.empty() && caller != owner) {
      return absl::PermissionDeniedError(absl::StrCat(
          "job ", first.job(), " belongs to principal '", owner, "', not '", caller, "'"));
    }
    return it->second;
  }
  if (auto t = tombstones_.find(first.job());
      t != tombstones_.end() && !t->second.empty() && caller != t->second) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the name ", first.job(), " belongs to principal '", t->second,
        "' (a deleted job's name is kept for its owner); the owner's side or an admin "
        "releases it (dynmo-ctl delete ", first.job(), " --release_name)"));
  }
  if (static_cast<int>(jobs_.size()) >= limits_.max_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the coordinator already serves ", limits_.max_jobs, " jobs (--max_jobs)"));
  }
  if (!caller.empty() && limits_.max_jobs_per_owner > 0) {
    int owned = 0;
    for (const auto& [name, job] : jobs_) owned += job->owner() == caller ? 1 : 0;
    if (owned >= limits_.max_jobs_per_owner) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "principal '", caller, "' already has ", owned,
          " jobs (--max_jobs_per_principal); delete one first"));
    }
  }
  auto job = std::make_shared<JobState>(first, options_, deps_, caller);
  // The job and its owner are durable before any rank hears OK: a restart
  // must never let the first principal to register the name take it over.
  // A job that could not be saved is not created (UNAVAILABLE).
  if (absl::Status s = job->Persist(); !s.ok()) {
    job->Close(absl::StrCat("job ", first.job(), " could not be saved"));
    return s;
  }
  jobs_[first.job()] = job;
  tombstones_.erase(first.job());  // its record replaced the tombstone
  LogEvent(LogLevel::kInfo, "job_created",
           {{"job", first.job()}, {"owner", caller}, {"pp", first.pipeline_size()},
            {"dp", first.data_parallel_size()}, {"layers", first.num_layers()}});
  return job;
}

absl::StatusOr<std::shared_ptr<JobState>> JobRegistry::Find(
    const std::string& name) const {
  absl::MutexLock lock(&mu_);
  if (auto q = quarantined_.find(name); q != quarantined_.end()) return q->second;
  auto it = jobs_.find(name);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job named '", name, "'"));
  }
  return it->second;
}

absl::StatusOr<int> JobRegistry::Delete(const std::string& name, bool force, bool release_name) {
  // Under the registry's lock throughout, so no rank can re-create the job
  // between its removal from disk and from the map.
  absl::MutexLock lock(&mu_);
  if (quarantined_.count(name) > 0) {
    // Kept aside for a post-mortem; the name is free again.
    if (absl::Status s = deps_.keeper->SetAsideJob(name); !s.ok()) return s;
    quarantined_.erase(name);
    PublishQuarantinedLocked();
    LogEvent(LogLevel::kWarning, "job_deleted", {{"job", name}, {"quarantined", true}});
    return 0;
  }
  auto it = jobs_.find(name);
  if (it == jobs_.end()) {
    if (tombstones_.count(name) > 0) {
      if (!release_name) {
        return absl::FailedPreconditionError(absl::StrCat(
            "job ", name, " was deleted; its name is kept for principal '", tombstones_[name],
            "' (delete with release_name to give it up)"));
      }
      if (absl::Status s = deps_.keeper->RemoveJob(name); !s.ok()) return s;
      tombstones_.erase(name);
      LogEvent(LogLevel::kInfo, "job_name_released", {{"job", name}});
      return 0;
    }
    return absl::NotFoundError(absl::StrCat("no job named '", name, "'"));
  }
  std::shared_ptr<JobState> job = it->second;
  const int connected = job->Summary().connected_ranks();
  if (connected > 0 && !force) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", name, " has ", connected,
        " connected ranks; stop them first, or delete with force"));
  }
  const int closed = job->Close(absl::StrCat("job ", name, " was deleted"));
  if (absl::Status s = ForgetLocked(name, job->owner(), release_name); !s.ok()) {
    job->Reopen();
    return s;
  }
  jobs_.erase(it);
  const bool kept = !job->owner().empty() && !release_name;
  if (kept) tombstones_[name] = job->owner();
  LogEvent(LogLevel::kInfo, "job_deleted",
           {{"job", name}, {"sessions_ended", closed}, {"forced", force},
            {"name_kept_for", kept ? job->owner() : ""}});
  return closed;
}

absl::Status JobRegistry::ForgetLocked(const std::string& name, const std::string& owner,
                                       bool release_name) {
  if (owner.empty() || release_name) return deps_.keeper->RemoveJob(name);
  dynmo::v1::JobRecord tombstone;
  tombstone.set_name(name);
  tombstone.set_owner(owner);
  tombstone.set_tombstone(true);
  return deps_.keeper->CommitJob(tombstone);
}

std::optional<std::string> JobRegistry::TombstoneOwner(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto t = tombstones_.find(name);
  if (t == tombstones_.end()) return std::nullopt;
  return t->second;
}

std::vector<std::string> JobRegistry::ExpireIdle(absl::Time now, absl::Duration idle) {
  std::vector<std::string> expired;
  for (const auto& job : All()) {
    if (job->IdleSince() + idle > now) continue;
    if (Delete(job->name(), /*force=*/false).ok()) expired.push_back(job->name());
  }
  return expired;
}

absl::StatusOr<std::shared_ptr<JobState>> JobRegistry::FindFor(
    const std::string& name, const std::string& caller) const {
  absl::StatusOr<std::shared_ptr<JobState>> job = Find(name);
  if (!job.ok()) return job;
  const std::string& owner = (*job)->owner();
  if (!caller.empty() && !owner.empty() && caller != owner) {
    return absl::PermissionDeniedError(absl::StrCat(
        "job ", name, " belongs to principal '", owner, "', not '", caller, "'"));
  }
  return job;
}

std::vector<std::shared_ptr<JobState>> JobRegistry::All() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<JobState>> out;
  for (const auto& [name, job] : jobs_) out.push_back(job);
  return out;
}

}  // namespace dynmo::service
