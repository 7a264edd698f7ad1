// EmbeddedCoordinator: the coordinator service running inside the trainer's
// process, on a loopback port, for single-node runs with no daemon to
// deploy. One process (say local rank 0) starts it and hands address() to
// the other ranks (e.g. through an environment variable); every rank,
// including that one, then starts an ordinary Agent against it. It is the
// same CoordinatorServer the dynmo-coordinator daemon runs, so the protocol,
// metrics and state dir behave identically. Lives in the dynmo_agent_embedded
// target so that plain agents do not link the service.
#ifndef DYNMO_AGENT_EMBEDDED_COORDINATOR_H_
#define DYNMO_AGENT_EMBEDDED_COORDINATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/service/server.h"

namespace dynmo::agent {

class EmbeddedCoordinator {
 public:
  // Starts serving on options.listen (default 127.0.0.1:0: loopback only,
  // any free port).
  static absl::StatusOr<std::unique_ptr<EmbeddedCoordinator>> Start(
      service::ServerOptions options = {});

  // "127.0.0.1:PORT", to put in AgentConfig::coordinator.
  std::string address() const { return server_->address(); }
  service::CoordinatorServer& server() { return *server_; }

  void Shutdown() { server_->Shutdown(); }

 private:
  explicit EmbeddedCoordinator(std::unique_ptr<service::CoordinatorServer> s)
      : server_(std::move(s)) {}
  std::unique_ptr<service::CoordinatorServer> server_;
};

}  // namespace dynmo::agent

#endif  // DYNMO_AGENT_EMBEDDED_COORDINATOR_H_
