#include "coordinator/service/released_pool.h"

#include <algorithm>
#include <utility>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/service/event_log.h"
#include "coordinator/service/refusal_log.h"

namespace dynmo::service {
namespace {

constexpr size_t kMaxEvents = 4096;
constexpr size_t kMaxIdsPerCall = 4096;

// The first problems of a refused claim or return, each cut short, then
// how many more: a status message of at most a few KB.
std::string BoundedProblems(const std::vector<std::string>& problems) {
  std::string out;
  const size_t shown = std::min<size_t>(problems.size(), 16);
  for (size_t i = 0; i < shown; ++i) {
    absl::StrAppend(&out, i > 0 ? "; " : "", Bounded(problems[i], 128));
  }
  if (problems.size() > shown) absl::StrAppend(&out, "; ... (+", problems.size() - shown, " more)");
  return out;
}

bool LeaseExpired(const dynmo::v1::ReleasedGpu& g, absl::Time now) {
  return absl::FromUnixMillis(g.claimed_unix_ms()) +
             absl::Seconds(g.lease_seconds()) <=
         now;
}

}  // namespace

void ReleasedPool::Restore(const dynmo::v1::CoordinatorState& state) {
  absl::MutexLock lock(&mu_);
  gpus_.assign(state.pool().begin(), state.pool().end());
  next_id_ = state.next_gpu_id() > 0 ? state.next_gpu_id() : 1;
}

void ReleasedPool::RecordLocked(dynmo::v1::ReleasedEvent::Kind kind,
                                const dynmo::v1::ReleasedGpu& gpu) {
  dynmo::v1::ReleasedEvent event;
  event.set_kind(kind);
  *event.mutable_gpu() = gpu;
  Event e;
  e.seq = ++last_seq_;
  if (watchers_ == 0) return;  // nobody can read it
  e.kind = kind;
  e.encoded = event.SerializeAsString();
  events_.push_back(std::move(e));
  while (events_.size() > kMaxEvents) events_.pop_front();
}

absl::Status ReleasedPool::CommitLocked() {
  return keeper_->CommitPool(gpus_, next_id_);
}

absl::Status ReleasedPool::Add(std::vector<dynmo::v1::ReleasedGpu> gpus) {
  absl::MutexLock lock(&mu_);
  std::vector<dynmo::v1::ReleasedGpu> added;
  for (auto& g : gpus) {
    bool known = false;
    for (const auto& h : gpus_) {
      known = known || (h.job() == g.job() && h.epoch() == g.epoch() &&
                        h.rank() == g.rank());
    }
    if (known) continue;
    g.set_id(absl::StrCat("gpu-", next_id_++));
    g.set_state(dynmo::v1::ReleasedGpu::FREE);
    added.push_back(g);
  }
  if (added.empty()) return absl::OkStatus();
  const auto before = gpus_;
  const uint64_t before_id = next_id_;
  gpus_.insert(gpus_.end(), added.begin(), added.end());
  if (absl::Status s = CommitLocked(); !s.ok()) {
    gpus_ = before;
    next_id_ = before_id;
    return s;
  }
  for (const auto& g : added) RecordLocked(dynmo::v1::ReleasedEvent::RELEASED, g);
  return absl::OkStatus();
}

std::vector<dynmo::v1::ReleasedGpu> ReleasedPool::List(
    const std::string& job, bool include_claimed) const {
  absl::MutexLock lock(&mu_);
  std::vector<dynmo::v1::ReleasedGpu> out;
  for (const auto& g : gpus_) {
    if (!job.empty() && g.job() != job) continue;
    if (!include_claimed && g.state() == dynmo::v1::ReleasedGpu::CLAIMED) {
      continue;
    }
    out.push_back(g);
  }
  return out;
}

absl::StatusOr<std::vector<dynmo::v1::ReleasedGpu>> ReleasedPool::Claim(
    absl::Span<const std::string> ids, const std::string& holder,
    int64_t lease_seconds, absl::Time now) {
  if (ids.empty()) return absl::InvalidArgumentError("claim: no ids given");
  if (ids.size() > kMaxIdsPerCall) {
    return absl::InvalidArgumentError(
        absl::StrCat("claim: ", ids.size(), " ids, at most ", kMaxIdsPerCall));
  }
  if (holder.empty() || holder.size() > 256) {
    return absl::InvalidArgumentError("claim: holder must be 1..256 chars");
  }
  if (lease_seconds <= 0 || lease_seconds > 365LL * 24 * 3600) {
    return absl::InvalidArgumentError(
        "claim: lease_seconds must be in (0, one year]");
  }
  absl::MutexLock lock(&mu_);
  std::vector<size_t> index;
  std::vector<std::string> problems;
  for (const std::string& id : ids) {
    const size_t i = IndexOfLocked(id);
    if (i == gpus_.size()) {
      problems.push_back(absl::StrCat(id, ": unknown"));
      continue;
    }
    const auto& g = gpus_[i];
    if (g.state() == dynmo::v1::ReleasedGpu::CLAIMED && g.holder() != holder &&
        !LeaseExpired(g, now)) {
      problems.push_back(absl::StrCat(id, ": leased by ", g.holder()));
      continue;
    }
    for (size_t j : index) {
      if (j == i) problems.push_back(absl::StrCat(id, ": listed twice"));
    }
    index.push_back(i);
  }
  if (!problems.empty()) {
    // Bounded whatever the request's size: a status message past gRPC's
    // metadata limit would reach the client as RESOURCE_EXHAUSTED.
    const absl::Status refused = absl::FailedPreconditionError(absl::StrCat(
        "claim refused, nothing claimed: ", BoundedProblems(problems)));
    LogRefusal(LogLevel::kInfo, "claim_refused",
               {{"gpus", BoundedList(ids)}, {"holder", Bounded(holder, 64)},
                {"reason", Bounded(refused.message())}});
    return refused;
  }
  auto claimed = UpdateLocked(index, dynmo::v1::ReleasedEvent::CLAIMED,
                              [&](dynmo::v1::ReleasedGpu& g) {
                                g.set_state(dynmo::v1::ReleasedGpu::CLAIMED);
                                g.set_holder(holder);
                                g.set_claimed_unix_ms(absl::ToUnixMillis(now));
                                g.set_lease_seconds(lease_seconds);
                              });
  if (claimed.ok()) {
    LogEvent(LogLevel::kInfo, "claim",
             {{"gpus", BoundedList(ids, 64)}, {"holder", holder},
              {"lease_s", lease_seconds}});
  }
  return claimed;
}

absl::StatusOr<std::vector<dynmo::v1::ReleasedGpu>> ReleasedPool::UpdateLocked(
    const std::vector<size_t>& index, dynmo::v1::ReleasedEvent::Kind kind,
    const std::function<void(dynmo::v1::ReleasedGpu&)>& change) {
  std::vector<dynmo::v1::ReleasedGpu> before;  // the changed ones only
  before.reserve(index.size());
  std::vector<dynmo::v1::ReleasedGpu> out;
  out.reserve(index.size());
  for (size_t i : index) {
    before.push_back(gpus_[i]);
    change(gpus_[i]);
    out.push_back(gpus_[i]);
  }
  if (absl::Status s = CommitLocked(); !s.ok()) {
    // Nothing durable changed, so nothing changes in memory (in reverse: an
    // index named twice gets its first value back).
    for (size_t k = index.size(); k-- > 0;) gpus_[index[k]] = std::move(before[k]);
    return s;
  }
  for (const auto& g : out) RecordLocked(kind, g);
  return out;
}

size_t ReleasedPool::IndexOfLocked(const std::string& id) const {
  size_t i = 0;
  while (i < gpus_.size() && gpus_[i].id() != id) ++i;
  return i;
}

absl::StatusOr<std::vector<dynmo::v1::ReleasedGpu>> ReleasedPool::Return(
    absl::Span<const std::string> ids, const std::string& holder) {
  if (ids.empty()) return absl::InvalidArgumentError("return: no ids given");
  if (ids.size() > kMaxIdsPerCall) {
    return absl::InvalidArgumentError(
        absl::StrCat("return: ", ids.size(), " ids, at most ", kMaxIdsPerCall));
  }
  if (holder.empty()) return absl::InvalidArgumentError("return: no holder");
  absl::MutexLock lock(&mu_);
  std::vector<size_t> index;
  std::vector<std::string> problems;
  for (const std::string& id : ids) {
    const size_t i = IndexOfLocked(id);
    if (i == gpus_.size()) {
      problems.push_back(absl::StrCat(id, ": unknown"));
    } else if (gpus_[i].state() != dynmo::v1::ReleasedGpu::CLAIMED) {
      problems.push_back(absl::StrCat(id, ": not claimed"));
    } else if (gpus_[i].holder() != holder) {
      problems.push_back(
          absl::StrCat(id, ": claimed by ", gpus_[i].holder(), ", not ", holder));
    } else if (std::find(index.begin(), index.end(), i) != index.end()) {
      problems.push_back(absl::StrCat(id, ": listed twice"));
    } else {
      index.push_back(i);
    }
  }
  if (!problems.empty()) {
    const absl::Status refused = absl::FailedPreconditionError(absl::StrCat(
        "return refused, nothing returned: ", BoundedProblems(problems)));
    LogRefusal(LogLevel::kInfo, "return_refused",
               {{"gpus", BoundedList(ids)}, {"holder", Bounded(holder, 64)},
                {"reason", Bounded(refused.message())}});
    return refused;
  }
  auto returned = UpdateLocked(index, dynmo::v1::ReleasedEvent::RETURNED,
                               [](dynmo::v1::ReleasedGpu& g) {
                                 g.set_state(dynmo::v1::ReleasedGpu::FREE);
                                 g.clear_holder();
                                 g.clear_claimed_unix_ms();
                                 g.clear_lease_seconds();
                               });
  if (returned.ok()) {
    LogEvent(LogLevel::kInfo, "return",
             {{"gpus", BoundedList(ids, 64)}, {"holder", holder}});
  }
  return returned;
}

uint64_t ReleasedPool::WaitPast(uint64_t after, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  const uint64_t wake = wake_;
  auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return last_seq_ > after || wake_ != wake;
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  return last_seq_;
}

std::vector<ReleasedPool::Event> ReleasedPool::EventsAfter(uint64_t after, size_t max,
                                                          bool* behind) const {
  absl::MutexLock lock(&mu_);
  std::vector<Event> out;
  *behind = !events_.empty() && events_.front().seq > after + 1;
  if (*behind || events_.empty() || after >= last_seq_) return out;
  // Sequence numbers are consecutive: the event after `after` is at this index.
  for (size_t i = after + 1 - events_.front().seq; i < events_.size() && out.size() < max; ++i) {
    out.push_back(events_[i]);
  }
  return out;
}

uint64_t ReleasedPool::LastSeq() const {
  absl::MutexLock lock(&mu_);
  return last_seq_;
}

void ReleasedPool::AddWatcher() {
  absl::MutexLock lock(&mu_);
  ++watchers_;
}

void ReleasedPool::RemoveWatcher() {
  std::deque<Event> dropped;
  {
    absl::MutexLock lock(&mu_);
    if (watchers_ > 0) --watchers_;
    if (watchers_ > 0) return;
    dropped.swap(events_);
  }
  dropped.clear();
#if defined(__GLIBC__)
  // The history's strings were allocated on whichever gRPC thread recorded
  // them, spread over glibc's per-thread arenas; only a trim returns those
  // pages. Once per last watcher leaving, not per event.
  malloc_trim(0);
#endif
}

void ReleasedPool::WakeAll() {
  absl::MutexLock lock(&mu_);
  ++wake_;
}

}  // namespace dynmo::service
