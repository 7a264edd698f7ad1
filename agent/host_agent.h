// HostAgent: several ranks of one job hosted by one process, over ONE gRPC
// stream (AgentService.RegisterHost + HostSession), for processes that
// serve all ranks of a node (a per-node daemon, a launcher, the load
// generator). Each rank keeps its own protocol state (agent/rank_state.h:
// the same rules as Agent) behind a HostedRank handle with Agent's API:
//
//   auto host = HostAgent::Start(config);          // returns at once
//   HostedRank& r = host->rank(i);                 // i-th of config.ranks
//   each iteration k, per rank:
//     if (auto plan = r.PlanToApplyAt(k)) {
//       bool all = AllReduceMin(plan->epoch()) == plan->epoch();  // in-band
//       if (all) MigrateLayers(*plan);
//       r.Acknowledge(plan->epoch(), all);
//     }
//     run iteration k; r.ReportIteration(sample_of_k);
//
// What the multiplexing changes is only the transport: the ranks register
// together (all or nothing), share one stream, send their reports and acks
// in batches tagged with the rank (control messages first), and receive each
// plan message ONCE for all of them. Reconnection re-registers every rank
// with its own applied epoch, layout and held plan, exactly as each Agent
// would. A rank's communicator colour and key come from Plan.split by its
// own stage id, as with Agent.
//
// Reporting never blocks on the network (bounded queues, oldest dropped).
// Thread-safe: any thread may call any method of HostAgent or HostedRank;
// one mutex guards all ranks of the host.
#ifndef DYNMO_AGENT_HOST_AGENT_H_
#define DYNMO_AGENT_HOST_AGENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/agent_config.h"
#include "agent/channel.h"
#include "agent/hosted_rank.h"
#include "dynmo/v1/plan.pb.h"
#include "grpcpp/channel.h"

namespace dynmo::agent {

struct HostAgentConfig {
  std::string coordinator;  // "host:port"
  ChannelOptions channel;
  std::shared_ptr<grpc::Channel> shared_channel;  // instead of dialling
  // The session's identity: a newer session of the same host replaces an
  // older one. Default: ranks[0].host.
  std::string host;
  // Bearer token sent on RegisterHost and HostSession (as AgentConfig's).
  std::string token;
  // One entry per hosted rank, all of one job; only the rank fields are
  // used (job, rank, coordinates, sizes, layers, layout, queue_capacity...).
  std::vector<AgentConfig> ranks;

  size_t max_batch = 256;  // rank messages per upstream write
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(5);
  absl::Duration rpc_timeout = absl::Seconds(5);
};

class HostAgent {
 public:
  // Validates the config (each rank as Agent does; one job; distinct ranks)
  // and starts the connection thread. Does not wait for the coordinator.
  static absl::StatusOr<std::unique_ptr<HostAgent>> Start(
      const HostAgentConfig& config);
  ~HostAgent();

  size_t size() const;
  HostedRank& rank(size_t index);  // index into config.ranks

  // Blocks until the host session is open or `timeout` passes.
  bool WaitConnected(absl::Duration timeout) const;
  // Stops the connection thread (closing the session). Idempotent. The
  // rank handles stay valid (reports queue, nothing is sent).
  void Stop();

 private:
  explicit HostAgent(std::unique_ptr<RankLink> link);
  std::unique_ptr<RankLink> link_;
  std::vector<HostedRank> ranks_;
};

}  // namespace dynmo::agent

#endif  // DYNMO_AGENT_HOST_AGENT_H_
