// JobState's lifetime: a job is open from its first registration (or its
// restore) until it is deleted. Close (JobRegistry::Delete, expiry) ends
// its sessions, drops its metric series and makes every later call of its
// ranks NOT_FOUND; Reopen undoes it when the deletion could not be made
// durable; IdleSince says since when no rank has been connected or active.
//
// Part of JobState (job_state.h): the job's lock as everywhere else.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/service/job_state.h"

namespace dynmo::service {

absl::Status JobState::CheckOpenLocked() {
  if (closed_) {
    return absl::NotFoundError(absl::StrCat("job ", name_, " was deleted"));
  }
  last_activity_ = absl::Now();
  return absl::OkStatus();
}

int JobState::Close(const std::string& why) {
  Delivery delivery(&delivery_order_);  // the sessions end after the lock is released
  absl::MutexLock lock(&mu_);
  closed_ = true;
  JobEffects ends;
  for (SessionRanks& s : machine_->DetachAll()) {
    ends.closes.push_back({std::move(s.sink), absl::NotFoundError(why)});
  }
  metrics_.reset();  // its series leave /metrics with it
  const int closed = static_cast<int>(ends.closes.size());
  delivery.Take(ends);
  return closed;
}

void JobState::Reopen() {
  absl::MutexLock lock(&mu_);
  closed_ = false;
  last_activity_ = absl::Now();
  if (deps_.metrics != nullptr) metrics_ = deps_.metrics->ForJob(name_);
}

absl::Time JobState::IdleSince() const {
  absl::MutexLock lock(&mu_);
  return machine_->connected() > 0 ? absl::InfiniteFuture() : last_activity_;
}

}  // namespace dynmo::service
