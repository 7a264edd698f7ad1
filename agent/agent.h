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
// then it stops, and stats().gave_up and last_error say why.
// ReportIteration never blocks on the network: samples wait in a bounded
// queue that drops the OLDEST when full, so a slow or absent coordinator
// costs training nothing, and the trainer keeps running on the last plan it
// applied.
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
// The per-rank calls are HostedRank's (hosted_rank.h): an Agent is the one
// rank of a RankLink of its own, over the Session stream.
//
// Thread-safe: any thread may call any method.
#ifndef DYNMO_AGENT_AGENT_H_
#define DYNMO_AGENT_AGENT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "agent/agent_config.h"
#include "agent/hosted_rank.h"

namespace dynmo::agent {

class Agent : public HostedRank {
 public:
  // Validates the config and starts the background thread. Does not wait for
  // the coordinator: an unreachable one is retried with backoff.
  static absl::StatusOr<std::unique_ptr<Agent>> Start(const AgentConfig& config);
  ~Agent();

  // Stops the background thread (closing the session). Idempotent.
  void Stop();

 private:
  explicit Agent(std::unique_ptr<RankLink> link);
  std::unique_ptr<RankLink> link_;
};

}  // namespace dynmo::agent

#endif  // DYNMO_AGENT_AGENT_H_
