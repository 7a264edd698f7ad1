// Channels to a coordinator: plaintext, TLS (server verified against a CA)
// or mutual TLS (plus a client certificate), and the bearer token the
// scheduler and operator RPCs require. Shared by the agent and the tools.
#ifndef DYNMO_AGENT_CHANNEL_H_
#define DYNMO_AGENT_CHANNEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"

namespace dynmo::agent {

struct ChannelOptions {
  std::string tls_ca;    // PEM CA file; set = TLS
  std::string tls_cert;  // PEM client certificate file (mutual TLS)
  std::string tls_key;   // PEM client key file (mutual TLS)
  std::string tls_server_name;  // override the name checked in the cert
  // Channels with different `index` never share a TCP connection (gRPC pools
  // identical channels): many agents in one process spread over several.
  int index = 0;
};

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(
    const std::string& address, const ChannelOptions& options);

// `shared` when set (a channel the caller already holds), else a new one to
// `address` (MakeChannel).
absl::StatusOr<std::shared_ptr<grpc::Channel>> SharedOrNewChannel(
    std::shared_ptr<grpc::Channel> shared, const std::string& address,
    const ChannelOptions& options);

// Reads a token file (whitespace trimmed).
absl::StatusOr<std::string> ReadToken(const std::string& path);

// A refusal that retrying cannot change: INVALID_ARGUMENT (the request is
// malformed), UNAUTHENTICATED / PERMISSION_DENIED (the credential),
// UNIMPLEMENTED (not a coordinator). Agents stop reconnecting on these
// instead of retrying them as transient.
bool IsPermanentRefusal(const grpc::Status& status);

// Adds "authorization: Bearer <token>" (nothing when token is empty).
void AddBearerToken(grpc::ClientContext* context, const std::string& token);

}  // namespace dynmo::agent

#endif  // DYNMO_AGENT_CHANNEL_H_
