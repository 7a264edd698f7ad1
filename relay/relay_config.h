// What configures a node relay (NodeRelayConfig), what it says about itself
// (NodeRelayStats) and about each rank it carries (RankProgress): plain
// structs shared by the relay's parts (node_relay.h and the roles under it).
// Thread-compatible.
#ifndef DYNMO_RELAY_RELAY_CONFIG_H_
#define DYNMO_RELAY_RELAY_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "agent/channel.h"
#include "grpcpp/channel.h"

namespace dynmo::relay {

struct NodeRelayConfig {
  // Where the ranks connect: "unix:/path/relay.sock" (the socket file is
  // replaced if it exists), or "HOST:PORT" (port 0 picks a free one).
  std::string listen;
  std::string coordinator;  // upstream "host:port"
  agent::ChannelOptions channel;  // TLS to the coordinator
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

}  // namespace dynmo::relay

#endif  // DYNMO_RELAY_RELAY_CONFIG_H_
