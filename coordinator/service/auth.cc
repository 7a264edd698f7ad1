#include "coordinator/service/auth.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "coordinator/service/event_log.h"
#include "coordinator/service/refusal_log.h"
#include "grpcpp/security/auth_context.h"

namespace dynmo::service {
namespace {

constexpr uint32_t kAllRoles = static_cast<uint32_t>(Role::kAgent) |
                               static_cast<uint32_t>(Role::kOperator) |
                               static_cast<uint32_t>(Role::kScheduler);

const char* RoleName(Role r) {
  switch (r) {
    case Role::kAgent: return "agent";
    case Role::kOperator: return "operator";
    case Role::kScheduler: return "scheduler";
    case Role::kAdmin: return "admin";
  }
  return "?";
}

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " ", path));
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

absl::StatusOr<std::string> ReadToken(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path, "token file");
  if (!text.ok()) return text.status();
  std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is empty"));
  }
  return token;
}

// One log line per refused call, bounded in size and rate (refusal_log.h):
// a flood of bad credentials must not flood the log.
void LogAuthRefusal(const grpc::ServerContextBase& context, Role role, const absl::Status& s) {
  LogRefusal(LogLevel::kWarning, "auth_refused",
             {{"role", RoleName(role)},
              {"peer", Bounded(context.peer(), 128)},
              {"code", absl::StatusCodeToString(s.code())},
              {"reason", Bounded(s.message())}});
}

}  // namespace


absl::StatusOr<Authenticator> Authenticator::ParsePrincipals(const std::string& text,
                                                             const std::string& source) {
  Authenticator auth;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    std::vector<absl::string_view> f =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_no, ": ", why));
    };
    if (f.size() != 3 && f.size() != 4) {
      return bad("want <token or x509:identity> <name> <roles> [tenant=<tenant>]");
    }
    Principal p;
    p.name = std::string(f[1]);
    p.identified = true;
    if (f.size() == 4) {
      absl::string_view tenant = f[3];
      if (!absl::ConsumePrefix(&tenant, "tenant=") || tenant.empty()) {
        return bad(absl::StrCat("'", f[3], "' is not tenant=<tenant>"));
      }
      p.tenant = std::string(tenant);
    }
    for (absl::string_view r : absl::StrSplit(f[2], ',')) {
      if (r == "agent") {
        p.roles |= static_cast<uint32_t>(Role::kAgent);
      } else if (r == "operator") {
        p.roles |= static_cast<uint32_t>(Role::kOperator);
      } else if (r == "scheduler") {
        p.roles |= static_cast<uint32_t>(Role::kScheduler);
      } else if (r == "admin") {
        p.roles |= static_cast<uint32_t>(Role::kAdmin) | static_cast<uint32_t>(Role::kOperator);
      } else {
        return bad(absl::StrCat("unknown role '", r, "' (agent, operator, scheduler, admin)"));
      }
    }
    absl::string_view credential = f[0];
    if (absl::ConsumePrefix(&credential, "x509:")) {
      if (credential.empty()) return bad("empty x509 identity");
      if (!auth.x509_.emplace(std::string(credential), p).second) {
        return bad(absl::StrCat("x509 identity '", credential, "' listed twice"));
      }
      continue;
    }
    if (credential.size() < 16) return bad("a token must be at least 16 characters");
    for (const auto& [token, other] : auth.tokens_) {
      if (token == credential) return bad("token listed twice");
    }
    auth.AddToken(std::string(credential), std::move(p));
  }
  if (!auth.enabled()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": no principal"));
  }
  return auth;
}

absl::StatusOr<Authenticator> Authenticator::FromFiles(const std::string& principals_file,
                                                       const std::string& token_file,
                                                       const std::string& agent_token_file) {
  if (!principals_file.empty()) {
    if (!token_file.empty() || !agent_token_file.empty()) {
      return absl::InvalidArgumentError(
          "--principals_file replaces --token_file and --agent_token_file: give one");
    }
    absl::StatusOr<std::string> text = ReadFile(principals_file, "principals file");
    if (!text.ok()) return text.status();
    return ParsePrincipals(*text, principals_file);
  }
  Authenticator auth;
  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = ReadToken(token_file);
    if (!token.ok()) return token.status();
    Principal p{"operator", kAllRoles, false};
    if (!agent_token_file.empty()) p.roles &= ~static_cast<uint32_t>(Role::kAgent);
    auth.AddToken(*token, std::move(p));
  }
  if (!agent_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadToken(agent_token_file);
    if (!token.ok()) return token.status();
    auth.AddToken(*token, Principal{"agents", static_cast<uint32_t>(Role::kAgent), false});
  }
  return auth;
}

absl::StatusOr<Principal> Authenticator::Check(const grpc::ServerContextBase& context,
                                               Role role) const {
  if (!enabled()) return Principal{"anonymous", kAllRoles, false};
  const Principal* found = nullptr;
  const auto& md = context.client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    absl::string_view value(it->second.data(), it->second.size());
    if (!absl::ConsumePrefix(&value, "Bearer ")) {
      return absl::UnauthenticatedError("the authorization metadata is not 'Bearer <token>'");
    }
    // Every entry is compared, whatever matches: no timing says which.
    for (const auto& [token, p] : tokens_) {
      if (ConstantTimeEquals(value, token) && found == nullptr) found = &p;
    }
    if (found == nullptr) return absl::UnauthenticatedError("wrong bearer token");
  } else if (!x509_.empty() && context.auth_context() != nullptr) {
    for (const grpc::string_ref& id : context.auth_context()->GetPeerIdentity()) {
      auto it = x509_.find(std::string(id.data(), id.size()));
      if (it != x509_.end()) {
        found = &it->second;
        break;
      }
    }
    if (found == nullptr) {
      return absl::UnauthenticatedError(
          "no bearer token, and the client certificate names no known principal");
    }
  } else {
    return absl::UnauthenticatedError("missing 'authorization: Bearer <token>' metadata");
  }
  if (!found->Has(role)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "principal '", found->name, "' lacks the ", RoleName(role), " role"));
  }
  return *found;
}

grpc::Status Authenticator::CheckStatus(const grpc::ServerContextBase& context, Role role,
                                        Principal* principal) const {
  absl::StatusOr<Principal> p = Check(context, role);
  if (!p.ok()) {
    LogAuthRefusal(context, role, p.status());
    return grpc::Status(static_cast<grpc::StatusCode>(p.status().code()),
                        std::string(p.status().message()));
  }
  if (principal != nullptr) *principal = *std::move(p);
  return grpc::Status::OK;
}

std::string Authenticator::TenantOf(const std::string& name) const {
  for (const auto& [token, p] : tokens_) {
    if (p.identified && p.name == name) return p.tenant_or_name();
  }
  for (const auto& [id, p] : x509_) {
    if (p.name == name) return p.tenant_or_name();
  }
  return name;
}

bool Authenticator::MayAct(const Principal& caller, const std::string& owner) const {
  if (!caller.identified || caller.Has(Role::kAdmin)) return true;
  return !owner.empty() && TenantOf(owner) == caller.tenant_or_name();
}

}  // namespace dynmo::service
