// Agent: the trainer rank's side of DynMo, without LibTorch.
//
//   auto agent = Agent::Start(config);           // returns at once
//   each iteration k:
//     if (auto plan = agent->PlanToApplyAt(k)) { // a committed plan is due
//       bool all = AllReduceMin(plan->epoch()) == plan->epoch();  // in-band
//       if (all) MigrateLayers(*plan);
//       agent->Acknowledge(plan->epoch(), all);
//     }
//     run iteration k; agent->ReportIteration(sample_of_k);
//
// A background thread owns the connection: Register, then one Session
// stream, whose reads and writes run on gRPC's callback threads (no thread
// per stream); it reconnects with exponential backoff (re-registering with
// the applied epoch, the layout and any plan it holds) whenever the stream
// breaks — unless the coordinator refused the registration for good
// (IsPermanentRefusal in channel.h: a malformed request, a bad token):
// then it stops, and stats().gave_up and last_error say why. ReportIteration never blocks on the network: samples wait in a
// bounded queue that drops the OLDEST when full, so a slow or absent
// coordinator costs training nothing, and the trainer keeps running on the
// last plan it applied.
//
// Plans follow the two-phase protocol of docs/protocol.md: the agent acks
// PREPARED for a plan newer than anything it settled whose apply iteration
// is still ahead, marks it committed on COMMIT, drops it on ABORT, and
// ignores any epoch it already settled (duplicates are re-acknowledged,
// never re-applied). A plan that is not committed when its apply iteration
// comes is failed, never applied late. The in-band agreement (the MIN
// all-reduce above) is what keeps ranks from diverging when a COMMIT reaches
// only some of them in time.
//
// Thread-safe: any thread may call any method.
#ifndef DYNMO_AGENT_AGENT_H_
#define DYNMO_AGENT_AGENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/agent_config.h"
#include "dynmo/v1/plan.pb.h"

namespace dynmo::agent {

class Agent {
 public:
  // Validates the config and starts the background thread. Does not wait for
  // the coordinator: an unreachable one is retried with backoff.
  static absl::StatusOr<std::unique_ptr<Agent>> Start(const AgentConfig& config);
  ~Agent();

  // Queues a sample (validated: finite, non-negative, layer ids in range).
  // Never blocks; drops the oldest queued sample when the queue is full.
  absl::Status ReportIteration(const IterationSample& sample);

  // The newest committed plan: the one waiting for its apply iteration, or
  // else the last applied one. nullopt before any.
  std::optional<dynmo::v1::Plan> LatestCommittedPlan() const;

  // The committed plan due at the start of `iteration`, if any. A prepared
  // plan that is due (or overdue) but not committed is failed here.
  std::optional<dynmo::v1::Plan> PlanToApplyAt(int64_t iteration);

  // Settles the plan of `epoch`: applied (switched at its apply iteration)
  // or not. FAILED_PRECONDITION when that epoch is not the pending plan.
  absl::Status Acknowledge(uint64_t epoch, bool applied,
                           const std::string& detail = "");

  AgentStats stats() const;

  // Blocks until the agent has an open session or `timeout` passes.
  bool WaitConnected(absl::Duration timeout) const;

  // Blocks until every queued acknowledgement has been written to the
  // session (or lost with a broken one) or `timeout` passes; true when none
  // is left. For a rank about to exit, e.g. one released by re-packing.
  bool Flush(absl::Duration timeout) const;

  // Stops the background thread (closing the session). Idempotent.
  void Stop();

 private:
  class Impl;
  explicit Agent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dynmo::agent

#endif  // DYNMO_AGENT_AGENT_H_
