#include "agent/hosted_rank.h"

#include "agent/rank_link.h"
#include "wire/plan_codec.h"

namespace dynmo::agent {

absl::Status HostedRank::ReportIteration(const IterationSample& sample) {
  return link_->Report(index_, sample);
}

std::optional<wire::Plan> HostedRank::LatestCommittedPlan() const {
  return wire::PlanFromProto(link_->LatestCommitted(index_));
}

std::optional<wire::Plan> HostedRank::PlanToApplyAt(int64_t iteration) {
  return wire::PlanFromProto(link_->DueAt(index_, iteration));
}

absl::Status HostedRank::Acknowledge(uint64_t epoch, bool applied,
                                     const std::string& detail) {
  return link_->Acknowledge(index_, epoch, applied, detail);
}

AgentStats HostedRank::stats() const { return link_->Stats(index_); }

bool HostedRank::WaitConnected(absl::Duration timeout) const {
  return link_->WaitConnected(timeout);
}

bool HostedRank::Flush(absl::Duration timeout) const {
  return link_->Flush(index_, timeout);
}

}  // namespace dynmo::agent
