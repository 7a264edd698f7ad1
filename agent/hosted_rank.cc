#include "agent/hosted_rank.h"

#include "absl/synchronization/mutex.h"
#include "agent/rank_link.h"
#include "wire/plan_codec.h"

namespace dynmo::agent {

// Each call takes the link's one lock, calls this rank's state (RankState,
// the protocol's rules) and, when that may have queued a message, starts a
// write after unlocking.

absl::Status HostedRank::ReportIteration(const IterationSample& sample) {
  {
    absl::MutexLock lock(&link_->mu_);
    if (absl::Status s = link_->ranks_[index_].Report(sample); !s.ok()) return s;
  }
  link_->live_.Kick();
  return absl::OkStatus();
}

std::optional<wire::Plan> HostedRank::LatestCommittedPlan() const {
  std::optional<dynmo::v1::Plan> plan;
  {
    absl::MutexLock lock(&link_->mu_);
    plan = link_->ranks_[index_].LatestCommitted();
  }
  return wire::PlanFromProto(plan);
}

std::optional<wire::Plan> HostedRank::PlanToApplyAt(int64_t iteration) {
  std::optional<dynmo::v1::Plan> plan;
  {
    absl::MutexLock lock(&link_->mu_);
    plan = link_->ranks_[index_].DueAt(iteration);
  }
  link_->live_.Kick();  // a FAILED ack may have been queued
  return wire::PlanFromProto(plan);
}

absl::Status HostedRank::Acknowledge(uint64_t epoch, bool applied,
                                     const std::string& detail) {
  absl::Status s;
  {
    absl::MutexLock lock(&link_->mu_);
    s = link_->ranks_[index_].Acknowledge(epoch, applied, detail);
  }
  link_->live_.Kick();
  return s;
}

AgentStats HostedRank::stats() const {
  absl::MutexLock lock(&link_->mu_);
  return link_->ranks_[index_].Stats(link_->connected_);
}

bool HostedRank::WaitConnected(absl::Duration timeout) const {
  return link_->WaitConnected(timeout);
}

bool HostedRank::Flush(absl::Duration timeout) const {
  return link_->Flush(index_, timeout);
}

}  // namespace dynmo::agent
