// Authenticator: who is calling the coordinator, and may they. Every RPC
// is checked for the role of its service — agent (AgentService: trainer
// ranks, node relays), operator (OperatorService), scheduler
// (SchedulerService) — against a table of principals:
//
//   * a principals file (--principals_file), one principal per line,
//       <credential> <name> <role>[,<role>...]     # comments and blanks ok
//     where the credential is a bearer token, or "x509:<identity>" for a
//     mutual-TLS client whose certificate's identity (its subject
//     alternative name, else its common name) is <identity>. Names are
//     identities: a scheduler's lease holder IS its principal's name.
//   * or the older shared tokens: --token_file is principal "operator"
//     (operator, scheduler, and agent unless --agent_token_file is given,
//     which is principal "agents"). Shared tokens name no one, so lease
//     holders stay names the callers choose.
//   * nothing: every call passes as the anonymous principal.
//
// A call without a known credential is UNAUTHENTICATED; a known principal
// without the service's role is PERMISSION_DENIED. Tokens are compared in
// constant time over every entry. Immutable after construction: thread-safe.
#ifndef DYNMO_COORDINATOR_SERVICE_AUTH_H_
#define DYNMO_COORDINATOR_SERVICE_AUTH_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "coordinator/job/constant_time.h"
#include "grpcpp/server_context.h"

namespace dynmo::service {


enum class Role : uint32_t { kAgent = 1, kOperator = 2, kScheduler = 4 };

struct Principal {
  std::string name;       // "anonymous" when auth is off
  uint32_t roles = 0;     // Role bits
  bool identified = false;  // from a principals file: the name is an identity
  bool Has(Role r) const { return (roles & static_cast<uint32_t>(r)) != 0; }
};

class Authenticator {
 public:
  Authenticator() = default;  // open: everyone is "anonymous" with every role

  // From the flags: a principals file, or the shared token files (not
  // both). Errors name the file and line.
  static absl::StatusOr<Authenticator> FromFiles(const std::string& principals_file,
                                                 const std::string& token_file,
                                                 const std::string& agent_token_file);
  // Parses a principals file's text (`source` names it in errors).
  static absl::StatusOr<Authenticator> ParsePrincipals(const std::string& text,
                                                       const std::string& source);

  bool enabled() const { return !tokens_.empty() || !x509_.empty(); }

  // The caller, if it may use a service of `role`.
  absl::StatusOr<Principal> Check(const grpc::ServerContextBase& context, Role role) const;
  // The same as a gRPC status (OK or the refusal), for the services.
  grpc::Status CheckStatus(const grpc::ServerContextBase& context, Role role,
                           Principal* principal = nullptr) const;

 private:
  void AddToken(std::string token, Principal p) {
    tokens_.emplace_back(std::move(token), std::move(p));
  }
  std::vector<std::pair<std::string, Principal>> tokens_;
  std::map<std::string, Principal> x509_;  // peer identity -> principal
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_AUTH_H_
