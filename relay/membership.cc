#include "relay/membership.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dynmo::relay {

Membership::Membership(std::string job, size_t report_queue_capacity)
    : job_(std::move(job)), report_queue_capacity_(report_queue_capacity) {}

std::shared_ptr<RankOutbox> Membership::Registered(int rank, std::string session_key) {
  registered_[rank] = std::move(session_key);
  // The new registration revoked the rank's older key: a session of it we
  // still hold is stale, and must not go upstream in a hello with that key.
  auto it = members_.find(rank);
  if (it == members_.end() || it->second.out == nullptr) return nullptr;
  ++stale_sessions_;
  MarkChanged();
  return std::move(it->second.out);
}

absl::Status Membership::Receive(int* rank, const std::shared_ptr<RankOutbox>& out,
                                 const dynmo::v1::AgentMessage& m,
                                 std::shared_ptr<RankOutbox>* replaced) {
  if (*rank < 0) {
    if (!m.has_hello()) {
      return absl::InvalidArgumentError(
          "the first Session message must be hello{job, rank}");
    }
    return Bind(rank, out, m.hello(), replaced);
  }
  if (m.has_report()) {
    RankProgress& p = progress_[*rank];
    p.rank = *rank;
    p.last_iteration = std::max(p.last_iteration, m.report().iteration());
    p.last_report = absl::Now();
    auto& reports = members_[*rank].queues.reports;
    reports.push_back(m.report());
    if (reports.size() > report_queue_capacity_) {
      reports.pop_front();
      ++reports_dropped_;
    }
  } else if (m.has_ack()) {
    members_[*rank].queues.acks.push_back(m.ack());
  } else if (m.has_hello()) {
    return absl::InvalidArgumentError("hello sent twice on one session");
  } else {
    return absl::InvalidArgumentError("empty Session message");
  }
  return absl::OkStatus();
}

absl::Status Membership::Bind(int* rank, const std::shared_ptr<RankOutbox>& out,
                              const dynmo::v1::SessionHello& hello,
                              std::shared_ptr<RankOutbox>* replaced) {
  if (hello.job() != job_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this node relay serves job '", job_, "', not '", hello.job(), "'"));
  }
  const int r = hello.rank();
  auto reg = registered_.find(r);
  if (reg == registered_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", r, " of job ", job_,
        " must call Register (through this relay) before opening a session"));
  }
  if (hello.session_key() != reg->second) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the session key of rank ", r,
        " is not the one its newest Register issued (register again)"));
  }
  Member& member = members_[r];
  *replaced = std::move(member.out);
  member.out = out;
  member.session_key = hello.session_key();
  ++rank_sessions_;
  *rank = r;
  MarkChanged();
  return absl::OkStatus();
}

void Membership::Leave(int rank, const RankOutbox* out) {
  auto it = members_.find(rank);
  if (it == members_.end() || it->second.out.get() != out) return;
  it->second.out = nullptr;
  ++rank_sessions_ended_;
  MarkChanged();
}

void Membership::MarkChanged() {
  changed_ = true;
  changed_at_ = absl::Now();
}

bool Membership::LeaversDrained() const {
  for (const auto& [rank, m] : members_) {
    if (m.out == nullptr && !m.queues.acks.empty()) return false;
  }
  return true;
}

void Membership::Settle(std::vector<int>* ranks, std::vector<std::string>* keys) {
  changed_ = false;
  ranks->clear();
  keys->clear();
  for (auto it = members_.begin(); it != members_.end();) {
    if (it->second.out == nullptr) {
      members_.erase(it++);  // left, and its last acks went (or timed out)
    } else {
      ranks->push_back(it->first);
      ++it;
    }
  }
  std::sort(ranks->begin(), ranks->end());
  for (int r : *ranks) keys->push_back(members_[r].session_key);
}

std::vector<std::shared_ptr<RankOutbox>> Membership::Clear() {
  changed_ = false;
  std::vector<std::shared_ptr<RankOutbox>> ending;
  for (auto& [rank, m] : members_) {
    if (m.out != nullptr) ending.push_back(std::move(m.out));
  }
  members_.clear();
  registered_.clear();
  return ending;
}

std::vector<std::shared_ptr<RankOutbox>> Membership::SessionsOf(
    const google::protobuf::RepeatedField<int32_t>& ranks) const {
  std::vector<std::shared_ptr<RankOutbox>> to;
  for (int r : ranks) {
    auto it = members_.find(r);
    if (it != members_.end() && it->second.out != nullptr) to.push_back(it->second.out);
  }
  return to;
}

size_t Membership::FillBatch(const std::vector<int>& ranks, size_t max,
                             dynmo::v1::HostBatch* batch) {
  std::vector<agent::BatchSource> sources;
  for (int r : ranks) {
    auto it = members_.find(r);
    if (it != members_.end()) sources.push_back({r, &it->second.queues});
  }
  return agent::FillHostBatch(sources, max, batch);
}

std::vector<RankProgress> Membership::Progress() const {
  std::vector<RankProgress> out;
  for (const auto& [rank, p] : progress_) out.push_back(p);
  std::sort(out.begin(), out.end(),
            [](const RankProgress& a, const RankProgress& b) { return a.rank < b.rank; });
  return out;
}

void Membership::FillStats(NodeRelayStats* s) const {
  s->registered_ranks = static_cast<int>(registered_.size());
  s->attached_ranks = 0;
  for (const auto& [rank, m] : members_) s->attached_ranks += m.out != nullptr;
  s->rank_sessions = rank_sessions_;
  s->rank_sessions_ended = rank_sessions_ended_;
  s->stale_sessions = stale_sessions_;
  s->reports_dropped = reports_dropped_;
}

}  // namespace dynmo::relay
