#include "agent/channel.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace dynmo::agent {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " ", path));
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(
    const std::string& address, const ChannelOptions& options) {
  if (address.empty()) {
    return absl::InvalidArgumentError("no coordinator address given");
  }
  grpc::ChannelArguments args;
  args.SetInt("dynmo.channel_index", options.index);
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20);
  // Reconnect quickly after a coordinator restart.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // Also the connect deadline: too small fails slow handshakes; the
  // default (20 s) would leave agents offline long after a restart.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (options.tls_ca.empty()) {
    if (!options.tls_cert.empty() || !options.tls_key.empty()) {
      return absl::InvalidArgumentError("a client certificate needs --tls_ca");
    }
    creds = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    absl::StatusOr<std::string> ca = ReadFile(options.tls_ca, "TLS CA");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    if (!options.tls_cert.empty() || !options.tls_key.empty()) {
      absl::StatusOr<std::string> cert =
          ReadFile(options.tls_cert, "client certificate");
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadFile(options.tls_key, "client key");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    if (!options.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(options.tls_server_name);
    }
    creds = grpc::SslCredentials(ssl);
  }
  return grpc::CreateCustomChannel(address, creds, args);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> SharedOrNewChannel(
    std::shared_ptr<grpc::Channel> shared, const std::string& address,
    const ChannelOptions& options) {
  if (shared != nullptr) return shared;
  return MakeChannel(address, options);
}

bool IsPermanentRefusal(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNIMPLEMENTED:
      return true;
    default:
      return false;
  }
}

absl::StatusOr<std::string> ReadToken(const std::string& path) {
  absl::StatusOr<std::string> s = ReadFile(path, "token file");
  if (!s.ok()) return s.status();
  std::string token(absl::StripAsciiWhitespace(*s));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is empty"));
  }
  return token;
}

void AddBearerToken(grpc::ClientContext* context, const std::string& token) {
  if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
}

}  // namespace dynmo::agent
