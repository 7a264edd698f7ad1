#include "coordinator/service/server.h"

#include <exception>
#include <optional>
#include <fstream>
#include <string>
#include <utility>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/service/agent_service.h"
#include "coordinator/service/auth.h"
#include "coordinator/service/operator_service.h"
#include "coordinator/service/scheduler_service.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "prometheus/exposer.h"

namespace dynmo::service {
namespace {

// Reads a PEM file and checks it holds a block of the expected kind, so a
// wrong or damaged file is one clear line here rather than gRPC's SSL log
// and "cannot listen".
absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what,
                                    absl::string_view begin, absl::string_view end) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read ", what, " ", path));
  }
  std::stringstream buf;
  buf << in.rdbuf();
  if (buf.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is empty"));
  }
  const std::string pem = buf.str();
  const absl::string_view text(pem);
  const size_t at = text.find(begin);
  if (at == absl::string_view::npos || text.find(end, at) == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " ", path, " holds no PEM block (", begin, " ... ", end, ")"));
  }
  return pem;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(
    const TlsFiles& tls) {
  if (tls.cert.empty() && tls.key.empty()) {
    if (!tls.client_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca needs --tls_cert and --tls_key");
    }
    return grpc::InsecureServerCredentials();
  }
  if (tls.cert.empty() || tls.key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  absl::StatusOr<std::string> cert = ReadPem(tls.cert, "TLS certificate",
                                                  "-----BEGIN CERTIFICATE-----",
                                                  "-----END CERTIFICATE-----");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(tls.key, "TLS key", "-----BEGIN",
                                                 "PRIVATE KEY-----");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions opts;
  opts.pem_key_cert_pairs.push_back({*key, *cert});
  if (!tls.client_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(tls.client_ca, "client CA",
                                                  "-----BEGIN CERTIFICATE-----",
                                                  "-----END CERTIFICATE-----");
    if (!ca.ok()) return ca.status();
    opts.pem_root_certs = *ca;
    opts.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(opts);
}

}  // namespace

absl::StatusOr<std::pair<std::string, std::string>> ReadMetricsLogin(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) {
    return absl::NotFoundError(absl::StrCat("cannot read the metrics login file ", path));
  }
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  const size_t colon = line.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == line.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics login file ", path, " must hold USER:PASSWORD on its first line"));
  }
  return std::make_pair(line.substr(0, colon), line.substr(colon + 1));
}

struct CoordinatorServer::Impl {
  std::unique_ptr<Coordinator> coordinator;
  Authenticator auth;
  std::unique_ptr<AgentServiceImpl> agent;
  std::unique_ptr<SchedulerServiceImpl> scheduler;
  std::unique_ptr<OperatorServiceImpl> op;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<prometheus::Exposer> exposer;
  int port = 0;
  int metrics_port = 0;
  std::string host;
  absl::Mutex mu;
  bool shut_down = false;
};

CoordinatorServer::CoordinatorServer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const ServerOptions& options) {
  auto impl = std::make_unique<Impl>();
  absl::StatusOr<Authenticator> auth = Authenticator::FromFiles(
      options.principals_file, options.token_file, options.agent_token_file);
  if (!auth.ok()) return auth.status();
  impl->auth = *std::move(auth);
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds =
      Credentials(options.tls);
  if (!creds.ok()) return creds.status();

  std::optional<std::pair<std::string, std::string>> login;
  if (!options.metrics_auth_file.empty()) {  // checked even with /metrics off
    absl::StatusOr<std::pair<std::string, std::string>> read =
        ReadMetricsLogin(options.metrics_auth_file);
    if (!read.ok()) return read.status();
    login = *std::move(read);
  }

  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator =
      Coordinator::Create(options.coordinator);
  if (!coordinator.ok()) return coordinator.status();
  impl->coordinator = *std::move(coordinator);

  if (!options.metrics_listen.empty()) {
    try {
      impl->exposer = std::make_unique<prometheus::Exposer>(
          options.metrics_listen);
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat(
          "cannot serve metrics on ", options.metrics_listen, ": ", e.what()));
    }
    impl->exposer->RegisterCollectable(
        impl->coordinator->metrics().registry());
    if (login.has_value()) {
      impl->exposer->RegisterAuth(
          [login = *login](const std::string& user, const std::string& password) {
            // Both compared, whichever differs: the time says neither.
            const bool user_ok = ConstantTimeEquals(user, login.first);
            const bool password_ok = ConstantTimeEquals(password, login.second);
            return user_ok && password_ok;
          },
          "dynmo-coordinator");
    }
    std::vector<int> ports = impl->exposer->GetListeningPorts();
    impl->metrics_port = ports.empty() ? 0 : ports.front();
  }

  impl->agent = std::make_unique<AgentServiceImpl>(impl->coordinator.get(), &impl->auth,
                                                   options.pending);
  impl->scheduler = std::make_unique<SchedulerServiceImpl>(
      impl->coordinator.get(), &impl->auth, options.max_watchers,
      rpc::OutboxBound{static_cast<size_t>(options.watcher_backlog_events),
                       static_cast<size_t>(options.watcher_backlog_bytes),
                       ReleasedWatchers::kEventOverheadBytes});
  impl->op = std::make_unique<OperatorServiceImpl>(impl->coordinator.get(),
                                                   &impl->auth);

  grpc::EnableDefaultHealthCheckService(true);
  if (options.reflection) grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, *creds, &impl->port);
  // One coordinator per address: without this, gRPC's SO_REUSEPORT lets a
  // second one bind the same port and the kernel splits calls between them.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  // Connections (docs/operations.md, "Connections and keepalive"): a
  // connection with no call for 10 minutes is closed (GOAWAY, the client
  // reconnects when it needs to); the server pings a connection silent for
  // 2 minutes and drops it when no answer comes within 20 s (a dead or
  // stalled peer); clients may ping every 30 s, also without calls (the
  // agents' default stays far below that).
  // Streams one connection may hold open at once: a client that opens tens
  // of thousands (Sessions that never say hello) queues them on its own
  // side instead of in this process's memory (docs/operations.md).
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             options.max_streams_per_connection);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 10 * 60 * 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 2 * 60 * 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20 * 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             30 * 1000);
  builder.RegisterService(impl->agent.get());
  builder.RegisterService(impl->scheduler.get());
  builder.RegisterService(impl->op.get());
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || impl->port == 0) {
    impl->coordinator->Stop();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen));
  }
  // Health: "" (the whole server) stays SERVING while reads are served;
  // "dynmo.state" is NOT_SERVING while the state dir takes no writes
  // (read-only mode, docs/operations.md).
  if (grpc::HealthCheckServiceInterface* health = impl->server->GetHealthCheckService()) {
    impl->coordinator->SetWritableListener([health](bool writable) {
      health->SetServingStatus("dynmo.state", writable);
    });
  }
  std::string host = options.listen.substr(0, options.listen.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "[::]") host = "127.0.0.1";
  impl->host = host;
  return std::unique_ptr<CoordinatorServer>(
      new CoordinatorServer(std::move(impl)));
}

int CoordinatorServer::port() const { return impl_->port; }

std::string CoordinatorServer::address() const {
  return absl::StrCat(impl_->host, ":", impl_->port);
}

int CoordinatorServer::metrics_port() const { return impl_->metrics_port; }

int CoordinatorServer::pending_sessions() const { return impl_->agent->pending_sessions(); }

Coordinator& CoordinatorServer::coordinator() { return *impl_->coordinator; }

void CoordinatorServer::Wait() {
  absl::MutexLock lock(&impl_->mu);
  impl_->mu.Await(absl::Condition(&impl_->shut_down));
}

void CoordinatorServer::Shutdown() {
  {
    absl::MutexLock lock(&impl_->mu);
    if (impl_->shut_down) return;
  }
  impl_->scheduler->Stop();
  impl_->coordinator->pool().WakeAll();
  impl_->server->Shutdown(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(500));
  impl_->server->Wait();
  impl_->coordinator->Stop();
  impl_->coordinator->SetWritableListener(nullptr);  // the health service goes with the server
  absl::MutexLock lock(&impl_->mu);
  impl_->shut_down = true;
}

}  // namespace dynmo::service
