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
// of the coordinator. One relay serves one job (HostSession carries one).
// Authentication: upstream calls carry `token` (or, when it is empty, the bearer token the
// ranks presented on Register); downstream there is no credential check —
// put the socket in a directory only the job's user can enter (dynmo-launch
// uses a private mkdtemp directory).
//
// The relay is split by role, one file each: the server side toward the
// ranks (rank_server.h), the upstream side toward the coordinator
// (upstream.h), the forwarding of unary calls (call_forwarder.h,
// operator_forwarder.h) and the ranks it serves (membership.h, no I/O);
// this class wires them and runs the thread that re-opens the upstream
// session when the set of ranks settles, or ends every rank's session when
// it is lost.
//
// Thread-safe: one mutex guards the relay's state, in every role; gRPC's
// callback threads and one background thread (session changes, reaping) do
// the work. Stop() and the destructor may be called from any thread but a
// gRPC callback.
#ifndef DYNMO_RELAY_NODE_RELAY_H_
#define DYNMO_RELAY_NODE_RELAY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "relay/relay_config.h"

namespace dynmo::relay {

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

 private:
  class Impl;
  explicit NodeRelay(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dynmo::relay

#endif  // DYNMO_RELAY_NODE_RELAY_H_
