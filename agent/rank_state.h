// RankState: one rank's half of the plan protocol (docs/protocol.md), with
// no I/O: the one place its rules are written. RankLink (rank_link.h) holds
// one per rank it carries: Agent (agent.h) one behind its own Session
// stream, HostAgent (host_agent.h) several over one HostSession. The rules:
//
//   - PREPARE newer than anything settled or held, apply iteration still
//     ahead -> hold it, ack PREPARED (committed at once when the plan says
//     commit_with_prepare); a duplicate re-acks the current verdict; an
//     older one is ignored; a newer one supersedes (fails) an uncommitted
//     held plan; one that is already too late -> FAILED.
//   - COMMIT of the held epoch marks it committed; ABORT drops it.
//   - DueAt(k) returns the held plan only if committed and due exactly at
//     k; a due or overdue uncommitted plan is failed there.
//   - A report of an iteration >= the held plan's apply iteration fails it.
//   - Acknowledge settles the held epoch once.
//
// Outgoing reports and acks are queued here (reports bounded, dropping the
// oldest; acks bounded at 256) for the transport to take.
//
// Not thread-safe: the owner (RankLink) serialises every call with its lock.
#ifndef DYNMO_AGENT_RANK_STATE_H_
#define DYNMO_AGENT_RANK_STATE_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "agent/agent_config.h"
#include "agent/host_batch.h"
#include "dynmo/v1/agent.pb.h"
#include "dynmo/v1/plan.pb.h"

namespace dynmo::agent {

// Checks the rank fields of an AgentConfig (not the connection fields).
absl::Status ValidateRankConfig(const AgentConfig& config);

class RankState {
 public:
  explicit RankState(const AgentConfig& config);

  const AgentConfig& config() const { return config_; }

  // Validates the sample, queues its report, fails an overdue held plan.
  absl::Status Report(const IterationSample& sample);
  std::optional<dynmo::v1::Plan> LatestCommitted() const;
  std::optional<dynmo::v1::Plan> DueAt(int64_t iteration);
  absl::Status Acknowledge(uint64_t epoch, bool applied,
                           const std::string& detail);
  // One downstream PREPARE / COMMIT / ABORT for this rank.
  void HandleDown(const dynmo::v1::CoordinatorMessage& message);

  // What to (re)register with: layout, applied and held epochs, and the
  // rank's coordinates, which an applied re-shaping plan has changed
  // (plan.proto's Reshape: position p -> stage p / dp', replica p % dp',
  // the global batch shared by the dp' replicas).
  dynmo::v1::RegisterRequest MakeRegisterRequest() const;
  void OnRegistered(const dynmo::v1::RegisterResponse& response);
  // The key to present in the session's hello (the newest Register's).
  const std::string& session_key() const { return session_key_; }

  // Outgoing queues, oldest first. The transport pops from them.
  RankQueues& queues() { return out_; }
  std::deque<dynmo::v1::PlanAck>& acks() { return out_.acks; }
  std::deque<dynmo::v1::IterationReport>& reports() { return out_.reports; }
  // Acks queued or being written (for Flush).
  int64_t unsent_acks() const { return unsent_acks_; }
  // The transport wrote an ack taken from acks(), or lost it with a stream.
  void AckWritten() { --unsent_acks_; }

  // Counters the transport updates (connects, reports_sent, last_error).
  AgentStats& counters() { return stats_; }
  // A snapshot with the current layout; `connected` is the transport's.
  AgentStats Stats(bool connected) const;

 private:
  // An applied re-shape's new grid and coordinates for this rank.
  void Reposition(const dynmo::v1::Reshape& reshape);
  void QueueAck(uint64_t epoch, dynmo::v1::PlanAck::State state,
                const std::string& detail);
  void FailPending(const std::string& why);

  AgentConfig config_;  // coordinates change with an applied re-shape
  RankQueues out_;
  int64_t unsent_acks_ = 0;
  int64_t last_iteration_ = -1;
  uint64_t applied_epoch_ = 0;
  std::vector<int> boundaries_;
  std::vector<int> active_stages_;
  bool released_ = false;
  std::string session_key_;  // from the newest RegisterResponse
  std::optional<dynmo::v1::Plan> pending_;
  bool committed_ = false;
  uint64_t settled_epoch_ = 0;
  bool settled_applied_ = false;
  std::optional<dynmo::v1::Plan> applied_plan_;
  AgentStats stats_;
};

}  // namespace dynmo::agent

#endif  // DYNMO_AGENT_RANK_STATE_H_
