#include "coordinator/service/job_registry.h"

#include "absl/strings/str_cat.h"
#include "coordinator/service/validation.h"

namespace dynmo::service {

void JobRegistry::Restore(const dynmo::v1::CoordinatorState& state) {
  absl::MutexLock lock(&mu_);
  for (const auto& record : state.jobs()) {
    jobs_[record.name()] = std::make_shared<JobState>(record, options_, deps_);
  }
}

absl::StatusOr<std::shared_ptr<JobState>> JobRegistry::Register(
    const dynmo::v1::RegisterRequest& request,
    dynmo::v1::RegisterResponse* response) {
  if (absl::Status s = ValidateRegister(request); !s.ok()) return s;
  std::shared_ptr<JobState> job;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(request.job());
    if (it != jobs_.end()) {
      job = it->second;
    } else {
      if (static_cast<int>(jobs_.size()) >= max_jobs_) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "the coordinator already serves ", max_jobs_, " jobs"));
      }
      job = std::make_shared<JobState>(request, options_, deps_);
      jobs_[request.job()] = job;
    }
  }
  if (absl::Status s = job->Register(request, response); !s.ok()) return s;
  return job;
}

absl::StatusOr<std::shared_ptr<JobState>> JobRegistry::Find(
    const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(name);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job named '", name, "'"));
  }
  return it->second;
}

std::vector<std::shared_ptr<JobState>> JobRegistry::All() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<JobState>> out;
  for (const auto& [name, job] : jobs_) out.push_back(job);
  return out;
}

}  // namespace dynmo::service
