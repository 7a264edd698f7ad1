// CoordinatorServer: a Coordinator behind a gRPC server: the agent,
// scheduler and operator services, grpc.health.v1 health checking, server
// reflection, optional TLS / mutual TLS, the bearer token, and the
// Prometheus /metrics endpoint. The dynmo-coordinator daemon is this plus
// flags; the agent's embedded mode runs the same thing in-process on a
// loopback port. Start() returns once it is serving. Thread-safe.
#ifndef DYNMO_COORDINATOR_SERVICE_SERVER_H_
#define DYNMO_COORDINATOR_SERVICE_SERVER_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "coordinator/service/coordinator.h"
#include "coordinator/service/pending_sessions.h"

namespace dynmo::service {

struct TlsFiles {
  std::string cert;       // PEM server certificate chain; empty = plaintext
  std::string key;        // PEM private key
  std::string client_ca;  // PEM CA; set = mutual TLS (clients must present)
};

struct ServerOptions {
  std::string listen = "127.0.0.1:0";  // port 0: pick a free one
  std::string metrics_listen;          // empty: no /metrics endpoint
  TlsFiles tls;
  std::string token_file;              // empty: scheduler/operator RPCs open
  // The bearer token agents (trainer ranks) must present on every
  // AgentService RPC. Empty: token_file's token (so a secured coordinator
  // is secured for every caller); both empty: agent RPCs open.
  std::string agent_token_file;
  // Named principals with roles (auth.h); replaces both token files.
  std::string principals_file;
  // "USER:PASSWORD" (one line): /metrics then wants HTTP basic auth
  // (Prometheus' basic_auth). Empty: /metrics is open.
  std::string metrics_auth_file;
  // gRPC server reflection (grpcurl list). Health is always served, without
  // credentials, for probes. Process-wide in gRPC: off only when no server
  // of the process turned it on.
  bool reflection = true;
  int max_message_bytes = 4 << 20;     // larger messages: RESOURCE_EXHAUSTED
  // WatchReleased streams open at once; more: RESOURCE_EXHAUSTED.
  int max_watchers = 64;
  // What may wait for one WatchReleased reader (events, bytes); a reader
  // that falls that far behind is ended with RESOURCE_EXHAUSTED. Bytes
  // count each event's encoding plus gRPC's cost of holding it (about 256
  // bytes an event); they must hold the pool's snapshot (about 350 bytes
  // per released GPU: the default fits 2,900).
  int64_t watcher_backlog_events = 16384;
  int64_t watcher_backlog_bytes = 1 << 20;
  // A Session or HostSession's hello deadline, and the caps on streams
  // still waiting for theirs (pending_sessions.h).
  PendingLimits pending;
  // Streams one connection holds open at once (HTTP/2
  // MAX_CONCURRENT_STREAMS); more wait on the client's side.
  int max_streams_per_connection = 1024;
  CoordinatorOptions coordinator;
};

// The /metrics login, "USER:PASSWORD" on the file's first line;
// INVALID_ARGUMENT (NOT_FOUND for a file that cannot be read) in one line.
absl::StatusOr<std::pair<std::string, std::string>> ReadMetricsLogin(const std::string& path);

class CoordinatorServer {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      const ServerOptions& options);
  ~CoordinatorServer();

  // The bound port (useful with port 0) and "host:port" to dial.
  int port() const;
  std::string address() const;
  // 0 when there is no metrics endpoint.
  int metrics_port() const;
  Coordinator& coordinator();
  // Session and HostSession streams waiting for their hello now.
  int pending_sessions() const;

  // Blocks until Shutdown() is called.
  void Wait();
  // Stops serving (streams are cancelled after a short grace period) and the
  // decision thread. Idempotent.
  void Shutdown();

 private:
  struct Impl;
  explicit CoordinatorServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_SERVER_H_
