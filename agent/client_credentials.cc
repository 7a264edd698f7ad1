#include "agent/client_credentials.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dynmo::agent {

absl::StatusOr<ClientCredentials> CredentialsFrom(const cli::CoordinatorClientFlags& flags) {
  ClientCredentials c;
  c.channel.tls_ca = flags.tls_ca;
  c.channel.tls_cert = flags.tls_cert;
  c.channel.tls_key = flags.tls_key;
  c.channel.tls_server_name = flags.tls_server_name;
  if (!flags.token_file.empty()) {
    absl::StatusOr<std::string> token = ReadToken(flags.token_file);
    if (!token.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--coordinator_token_file: ", token.status().message()));
    }
    c.token = *std::move(token);
  }
  return c;
}

}  // namespace dynmo::agent
