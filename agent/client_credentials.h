// A client's way to a (possibly secured) coordinator: the channel options
// (TLS, mutual TLS) and the bearer token, made once from the values of the
// --coordinator_* flags every client shares (cli/coordinator_flags.h).
// dynmo-train's ranks, dynmo-launch's relay, dynmo-ctl and dynmo-loadgen all
// build their channels through it. Pure function of its input plus one read
// of the token file; thread-safe.
#ifndef DYNMO_AGENT_CLIENT_CREDENTIALS_H_
#define DYNMO_AGENT_CLIENT_CREDENTIALS_H_

#include <string>

#include "absl/status/statusor.h"
#include "agent/channel.h"
#include "cli/coordinator_flags.h"

namespace dynmo::agent {

struct ClientCredentials {
  ChannelOptions channel;
  std::string token;  // empty: none asked for
};

// The channel options of `flags` and the token read from its token file.
// INVALID_ARGUMENT starting "--coordinator_token_file: " when the file
// cannot be read or holds nothing.
absl::StatusOr<ClientCredentials> CredentialsFrom(const cli::CoordinatorClientFlags& flags);

}  // namespace dynmo::agent

#endif  // DYNMO_AGENT_CLIENT_CREDENTIALS_H_
