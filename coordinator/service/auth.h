// Authenticator: who is calling the coordinator, and may they. Every RPC
// is checked for the role of its service — agent (AgentService: trainer
// ranks, node relays), operator (OperatorService), scheduler
// (SchedulerService) — against a table of principals:
//
//   * a principals file (--principals_file), one principal per line,
//       <credential> <name> <role>[,<role>...] [tenant=<tenant>]   # comments ok
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
// without the service's role is PERMISSION_DENIED. Named principals belong
// to a tenant (their own name unless the file says tenant=...): an
// operator acts only on the jobs whose owner is of its tenant, unless it
// holds the admin role (MayAct). Tokens are compared in
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


// kAdmin: an operator over every tenant's jobs (releases any job's name).
enum class Role : uint32_t { kAgent = 1, kOperator = 2, kScheduler = 4, kAdmin = 8 };

struct Principal {
  std::string name;       // "anonymous" when auth is off
  uint32_t roles = 0;     // Role bits
  bool identified = false;  // from a principals file: the name is an identity
  std::string tenant;     // empty: the principal's own name
  bool Has(Role r) const { return (roles & static_cast<uint32_t>(r)) != 0; }
  const std::string& tenant_or_name() const { return tenant.empty() ? name : tenant; }
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

  // The tenant of the named principal `name` (its own name when no
  // principal of that name is listed).
  std::string TenantOf(const std::string& name) const;
  // Whether `caller` may act on a job owned by `owner` (a principal name;
  // empty: a job no named principal created): always without identities
  // (shared tokens, no auth) or with the admin role, else only when the
  // owner is of the caller's tenant.
  bool MayAct(const Principal& caller, const std::string& owner) const;

 private:
  void AddToken(std::string token, Principal p) {
    tokens_.emplace_back(std::move(token), std::move(p));
  }
  std::vector<std::pair<std::string, Principal>> tokens_;
  std::map<std::string, Principal> x509_;  // peer identity -> principal
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_AUTH_H_
