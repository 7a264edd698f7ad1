#include "coordinator/service/embedded_coordinator.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dynmo::service {

absl::StatusOr<std::unique_ptr<EmbeddedCoordinator>> EmbeddedCoordinator::Start(
    ServerOptions options) {
  if (options.listen.empty()) options.listen = "127.0.0.1:0";
  if (!absl::StartsWith(options.listen, "127.0.0.1:") &&
      !absl::StartsWith(options.listen, "localhost:") &&
      !absl::StartsWith(options.listen, "[::1]:")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedded coordinator must listen on loopback, not ", options.listen));
  }
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(options);
  if (!server.ok()) return server.status();
  return std::unique_ptr<EmbeddedCoordinator>(
      new EmbeddedCoordinator(*std::move(server)));
}

}  // namespace dynmo::service
