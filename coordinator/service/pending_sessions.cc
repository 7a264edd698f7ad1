#include "coordinator/service/pending_sessions.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dynmo::service {

bool PendingSessions::Wait::Settle(State to) {
  if (state_ != State::kWaiting) return false;
  state_ = to;
  return true;
}

bool PendingSessions::Wait::Greeted() {
  bool settled;
  {
    absl::MutexLock lock(&mu_);
    settled = Settle(State::kGreeted);
    if (!settled) return state_ == State::kGreeted;
  }
  owner_->Remove(id_);
  return true;
}

void PendingSessions::Wait::Gone() {
  bool settled;
  {
    absl::MutexLock lock(&mu_);
    settled = Settle(State::kGone);
  }
  if (settled) owner_->Remove(id_);
}

bool PendingSessions::Wait::Expire() {
  {
    absl::MutexLock lock(&mu_);
    if (!Settle(State::kExpired)) return false;
  }
  // Outside the lock: gRPC may run the stream's OnDone (and so Gone) inline.
  expire_();
  return true;
}

PendingSessions::PendingSessions(PendingLimits limits, std::function<void()> on_expired)
    : limits_(limits), on_expired_(std::move(on_expired)), reaper_([this] { Loop(); }) {}

PendingSessions::~PendingSessions() {
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }
  reaper_.join();
}

std::string PendingSessions::PeerHost(const std::string& peer) {
  // "ipv4:1.2.3.4:5", "ipv6:[::1]:5": the port is after the last ':'.
  if (peer.rfind("ipv4:", 0) == 0 || peer.rfind("ipv6:", 0) == 0) {
    const size_t colon = peer.rfind(':');
    if (colon > 5) return peer.substr(0, colon);
  }
  return peer;  // unix:..., or anything else: the whole string
}

absl::StatusOr<std::shared_ptr<PendingSessions::Wait>> PendingSessions::Admit(
    const std::string& peer, std::function<void()> expire) {
  const std::string host = PeerHost(peer);
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(entries_.size()) >= limits_.max_pending) {
    return absl::ResourceExhaustedError(absl::StrCat(
        limits_.max_pending, " sessions are waiting for their hello already "
        "(--max_pending_sessions); try again"));
  }
  int& from_host = per_host_[host];
  if (from_host >= limits_.max_pending_per_peer) {
    return absl::ResourceExhaustedError(absl::StrCat(
        from_host, " sessions from ", host, " are waiting for their hello already "
        "(--max_pending_sessions_per_peer); try again"));
  }
  ++from_host;
  const uint64_t id = next_id_++;
  std::shared_ptr<Wait> wait(new Wait(this, id, std::move(expire)));
  entries_[id] = Entry{wait, host, absl::Now() + limits_.hello_timeout};
  return wait;
}

void PendingSessions::Remove(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  auto host = per_host_.find(it->second.host);
  if (host != per_host_.end() && --host->second <= 0) per_host_.erase(host);
  entries_.erase(it);
}

int PendingSessions::pending() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(entries_.size());
}

void PendingSessions::Loop() {
  while (true) {
    std::vector<std::pair<uint64_t, std::shared_ptr<Wait>>> due;
    {
      absl::MutexLock lock(&mu_);
      // Deadlines come in admission order, so the first entries are due first.
      mu_.AwaitWithTimeout(absl::Condition(&stopped_), absl::Milliseconds(100));
      if (stopped_) return;
      const absl::Time now = absl::Now();
      for (const auto& [id, entry] : entries_) {
        if (entry.deadline > now) break;
        due.emplace_back(id, entry.wait.lock());
      }
    }
    for (auto& [id, wait] : due) {
      const bool expired = wait != nullptr && wait->Expire();
      Remove(id);
      if (expired && on_expired_) on_expired_();
    }
  }
}

}  // namespace dynmo::service
