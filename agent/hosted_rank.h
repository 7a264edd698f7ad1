// HostedRank: the calls a trainer makes for one rank — report an iteration,
// fetch the plan due at an iteration, acknowledge it — on a RankLink
// (rank_link.h) that carries the rank to the coordinator, alone or with the
// other ranks of its host. An Agent (agent.h) is a HostedRank over a link of
// its own; a HostAgent (host_agent.h) hands out one per rank it hosts. The
// link owns the rank's state; the handle is a pointer and an index, valid
// while the link lives.
//
// Thread-safe: any thread may call any method.
#ifndef DYNMO_AGENT_HOSTED_RANK_H_
#define DYNMO_AGENT_HOSTED_RANK_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "agent/agent_config.h"
#include "wire/plan_codec.h"

namespace dynmo::agent {

class RankLink;  // rank_link.h

class HostedRank {
 public:
  // Queues a sample (validated: finite, non-negative, layer ids in range).
  // Never blocks; drops the oldest queued sample when the queue is full.
  absl::Status ReportIteration(const IterationSample& sample);

  // The newest committed plan: the one waiting for its apply iteration, or
  // else the last applied one. nullopt before any.
  std::optional<wire::Plan> LatestCommittedPlan() const;

  // The committed plan due at the start of `iteration`, if any. A prepared
  // plan that is due (or overdue) but not committed is failed here.
  std::optional<wire::Plan> PlanToApplyAt(int64_t iteration);

  // Settles the plan of `epoch`: applied (switched at its apply iteration)
  // or not. FAILED_PRECONDITION when that epoch is not the pending plan.
  absl::Status Acknowledge(uint64_t epoch, bool applied,
                           const std::string& detail = "");

  AgentStats stats() const;

  // Blocks until the rank's link has an open session or `timeout` passes.
  bool WaitConnected(absl::Duration timeout) const;

  // Blocks until every queued acknowledgement has been written to the
  // session (or lost with a broken one) or `timeout` passes; true when none
  // is left. For a rank about to exit, e.g. one released by re-packing.
  bool Flush(absl::Duration timeout) const;

 protected:
  friend class HostAgent;
  HostedRank(RankLink* link, size_t index) : link_(link), index_(index) {}

 private:
  RankLink* link_;  // owned by the Agent or HostAgent
  size_t index_;
};

}  // namespace dynmo::agent

#endif  // DYNMO_AGENT_HOSTED_RANK_H_
