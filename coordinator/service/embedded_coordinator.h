// EmbeddedCoordinator: the coordinator service running inside another
// program's process (dynmo-launch, tests), on a loopback port, for
// single-node runs with no daemon to deploy. The process starts it and hands
// address() to the ranks (e.g. through an environment variable); each then
// starts an ordinary Agent against it. It is the same CoordinatorServer the
// dynmo-coordinator daemon runs, so the protocol, metrics and state dir
// behave identically. (dynmo-train run without a launcher starts the daemon
// itself as a child instead: trainer/run/local_coordinator.h.) Thread-safe as
// CoordinatorServer is.
#ifndef DYNMO_COORDINATOR_SERVICE_EMBEDDED_COORDINATOR_H_
#define DYNMO_COORDINATOR_SERVICE_EMBEDDED_COORDINATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/service/server.h"

namespace dynmo::service {

class EmbeddedCoordinator {
 public:
  // Starts serving on options.listen (default 127.0.0.1:0: loopback only,
  // any free port).
  static absl::StatusOr<std::unique_ptr<EmbeddedCoordinator>> Start(
      ServerOptions options = {});

  // "127.0.0.1:PORT", to put in AgentConfig::coordinator.
  std::string address() const { return server_->address(); }
  CoordinatorServer& server() { return *server_; }

  void Shutdown() { server_->Shutdown(); }

 private:
  explicit EmbeddedCoordinator(std::unique_ptr<CoordinatorServer> s)
      : server_(std::move(s)) {}
  std::unique_ptr<CoordinatorServer> server_;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_EMBEDDED_COORDINATOR_H_
