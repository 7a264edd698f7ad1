// BearerAuth: the token check of the coordinator's RPCs — one instance for
// the scheduler and operator RPCs, one for the agent RPCs (server.h). With
// no token configured every call passes; otherwise the call's
// `authorization` metadata must be exactly "Bearer <token>" (compared in
// constant time), else UNAUTHENTICATED.
// Immutable after construction, so thread-safe.
#ifndef DYNMO_COORDINATOR_SERVICE_AUTH_H_
#define DYNMO_COORDINATOR_SERVICE_AUTH_H_

#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/server_context.h"

namespace dynmo::service {

class BearerAuth {
 public:
  BearerAuth() = default;  // no token: open
  explicit BearerAuth(std::string token) : token_(std::move(token)) {}

  // Reads the token from a file (surrounding whitespace trimmed). Errors on
  // an unreadable or empty file.
  static absl::StatusOr<BearerAuth> FromFile(const std::string& path);

  bool enabled() const { return !token_.empty(); }
  grpc::Status Check(const grpc::ServerContextBase& context) const;

 private:
  std::string token_;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_AUTH_H_
