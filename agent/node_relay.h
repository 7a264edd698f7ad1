// NodeRelay: the per-node relay between a node's trainer ranks and the
// coordinator. It serves AgentService (Register and Session) to the local
// ranks, usually on a Unix-domain socket, and carries all their sessions
// upstream on ONE HostSession stream, so a cluster of N nodes holds N
// streams at the coordinator instead of one per rank:
//
//   rank 0  Agent ─┐
//   rank 1  Agent ─┼─ unix:/…/relay.sock ─ NodeRelay ══ one HostSession ══ coordinator
//   rank 7  Agent ─┘                                (+ each Register, unary)
//
// The ranks run the ordinary Agent (agent/agent.h), unchanged: the relay is
// a transport and holds no plan-protocol state. Each rank's Register is
// passed upstream as it is (so the coordinator sees the rank's own epoch,
// layout and held plan); its Session hello binds the rank to the relay;
// its reports and acks go upstream in HostBatch writes (acks first, then
// reports round-robin); each plan message the coordinator sends once for
// several ranks is written to each of their sessions. When the set of
// attached ranks changes, the relay opens a new HostSession for the new
// set after `settle` (the coordinator replaces the older session of the
// same host and re-sends any plan message in flight, which Agents
// re-acknowledge idempotently). When the upstream session is lost — the
// coordinator restarted, the network broke — the relay ends every rank's
// session with UNAVAILABLE, so each Agent re-registers through it exactly
// as it would after losing a direct session.
//
// The relay also forwards the OperatorService calls a rank makes (its job's
// policy, its status) as they are, so the socket is the rank's whole view
// of the coordinator. One relay serves one job (HostSession carries one). Authentication:
// upstream calls carry `token` (or, when it is empty, the bearer token the
// ranks presented on Register); downstream there is no credential check —
// put the socket in a directory only the job's user can enter (dynmo-launch
// uses a private mkdtemp directory).
//
// Thread-safe: one mutex guards the relay's state; gRPC's callback threads
// and one background thread (session changes, reaping) do the work. Stop()
// and the destructor may be called from any thread but a gRPC callback.
#ifndef DYNMO_AGENT_NODE_RELAY_H_
#define DYNMO_AGENT_NODE_RELAY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/channel.h"
#include "grpcpp/channel.h"

namespace dynmo::agent {

struct NodeRelayConfig {
  // Where the ranks connect: "unix:/path/relay.sock" (the socket file is
  // replaced if it exists), or "HOST:PORT" (port 0 picks a free one).
  std::string listen;
  std::string coordinator;  // upstream "host:port"
  ChannelOptions channel;   // TLS to the coordinator
  std::shared_ptr<grpc::Channel> shared_channel;  // instead of dialling
  std::string token;        // bearer token for the upstream calls
  std::string job;          // the one job this relay serves (required)
  std::string host;         // HostHello.host; empty: this machine's name
  // Quiet time after a rank attaches or leaves before the upstream session
  // is re-opened for the new set (ranks of a node start together).
  absl::Duration settle = absl::Milliseconds(20);
  // How long a leaving rank's last acks may take to go upstream before the
  // session is re-opened without it.
  absl::Duration drain = absl::Seconds(1);
  size_t max_batch = 256;             // rank messages per upstream write
  size_t report_queue_capacity = 64;  // per rank; the oldest is dropped
  absl::Duration rpc_timeout = absl::Seconds(5);  // upstream Register
};

struct NodeRelayStats {
  int registered_ranks = 0;       // passed Register since the last break
  int attached_ranks = 0;         // ranks with a live session through us
  int upstream_ranks = 0;         // ranks the live HostSession carries
  bool upstream_connected = false;
  int64_t upstream_sessions = 0;  // HostSessions opened
  int64_t upstream_breaks = 0;    // lost without being replaced by us
  int64_t messages_up = 0;        // reports and acks written upstream
  int64_t messages_down = 0;      // plan messages written to rank sessions
  int64_t upstream_messages = 0;  // plan messages read from upstream
  int64_t reports_dropped = 0;    // oldest reports dropped (queue full)
  int64_t rank_sessions = 0;      // rank sessions bound (hellos accepted)
  int64_t rank_sessions_ended = 0;
  int64_t stale_sessions = 0;     // ended because the rank registered again
  std::string last_error;
};

// The newest report of one rank that went through the relay (progress
// watching: dynmo-launch names a rank that stopped making progress).
struct RankProgress {
  int rank = -1;
  int64_t last_iteration = -1;     // -1: none yet
  absl::Time last_report = absl::InfinitePast();
};

class NodeRelay {
 public:
  // Validates the config, listens and starts. Errors: INVALID_ARGUMENT for
  // a bad config, UNAVAILABLE when `listen` cannot be bound.
  static absl::StatusOr<std::unique_ptr<NodeRelay>> Start(
      const NodeRelayConfig& config);
  ~NodeRelay();

  NodeRelay(const NodeRelay&) = delete;
  NodeRelay& operator=(const NodeRelay&) = delete;

  // What the ranks dial (AgentConfig::coordinator): "unix:/…" or
  // "127.0.0.1:PORT" with the port actually bound.
  const std::string& address() const;
  NodeRelayStats stats() const;
  // Every rank that reported through the relay, by rank.
  std::vector<RankProgress> progress() const;
  // Blocks until the upstream session carries exactly `ranks` ranks, or
  // `timeout` passes; true when it does.
  bool WaitUpstreamRanks(int ranks, absl::Duration timeout) const;

  // Ends every session (downstream and upstream) and stops. Idempotent.
  void Stop();

  class Impl;

 private:
  explicit NodeRelay(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dynmo::agent

#endif  // DYNMO_AGENT_NODE_RELAY_H_
