#include "relay/node_relay.h"

#include <unistd.h>

#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/channel.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "relay/call_forwarder.h"
#include "relay/membership.h"
#include "relay/operator_forwarder.h"
#include "relay/rank_server.h"
#include "relay/upstream.h"

namespace dynmo::relay {
namespace {

absl::Status ValidateRelayConfig(const NodeRelayConfig& c) {
  if (c.listen.empty()) {
    return absl::InvalidArgumentError("node relay: no listen address");
  }
  if (c.coordinator.empty() && c.shared_channel == nullptr) {
    return absl::InvalidArgumentError("node relay: no coordinator address");
  }
  if (c.job.empty()) {
    return absl::InvalidArgumentError("node relay: no job name");
  }
  if (c.max_batch < 1 || c.report_queue_capacity < 1) {
    return absl::InvalidArgumentError(
        "node relay: max_batch and report_queue_capacity must be >= 1");
  }
  if (c.settle < absl::ZeroDuration() || c.drain < absl::ZeroDuration() ||
      c.rpc_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "node relay: settle and drain must be >= 0, rpc_timeout > 0");
  }
  return absl::OkStatus();
}

std::string ThisHost() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') {
    return "localhost";
  }
  return name;
}

}  // namespace

// The roles under one mutex, the server that serves them, and the thread
// that follows the membership with the upstream session.
class NodeRelay::Impl {
 public:
  Impl(const NodeRelayConfig& config, std::shared_ptr<grpc::Channel> channel)
      : config_(config),
        members_(config.job, config.report_queue_capacity),
        forwarder_(&mu_, config.token, config.rpc_timeout),
        upstream_(&mu_, &members_, channel, config.job,
                  config.host.empty() ? ThisHost() : config.host, config.max_batch),
        rank_server_(&mu_, &members_, &upstream_, &forwarder_, channel, config.job),
        operator_forwarder_(&forwarder_, channel) {}

  absl::Status Listen() {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(config_.listen, grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&rank_server_);
    builder.RegisterService(&operator_forwarder_);
    server_ = builder.BuildAndStart();
    const bool unix_socket = absl::StartsWith(config_.listen, "unix:");
    if (server_ == nullptr || (!unix_socket && port == 0)) {
      server_.reset();
      return absl::UnavailableError(
          absl::StrCat("node relay: cannot listen on ", config_.listen));
    }
    address_ = unix_socket ? config_.listen : absl::StrCat("127.0.0.1:", port);
    thread_ = std::thread([this] { Run(); });
    return absl::OkStatus();
  }

  const std::string& address() const { return address_; }

  NodeRelayStats Stats() const {
    absl::MutexLock lock(&mu_);
    NodeRelayStats s;
    members_.FillStats(&s);
    upstream_.FillStatsLocked(&s);
    return s;
  }

  std::vector<RankProgress> Progress() const {
    absl::MutexLock lock(&mu_);
    return members_.Progress();
  }

  bool WaitUpstreamRanks(int ranks, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto carried = [this, ranks]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      // No session carries zero ranks.
      return stop_ || (ranks > 0 && upstream_.CarriedLocked() == ranks);
    };
    return mu_.AwaitWithTimeout(absl::Condition(&carried), timeout) && !stop_;
  }

  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return;
      stop_ = stopped_ = true;
      forwarder_.StopLocked();
      upstream_.StopLocked();
    }
    // Ends the ranks' sessions; their OnDone still reaches the roles.
    if (server_ != nullptr) {
      server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Milliseconds(200)));
    }
    if (thread_.joinable()) thread_.join();
    absl::MutexLock lock(&mu_);
    upstream_.CloseLocked();
    auto quiet = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return forwarder_.IdleLocked() && upstream_.QuietLocked();
    };
    mu_.Await(absl::Condition(&quiet));
    upstream_.ReapLocked();
  }

 private:
  // The background thread: re-opens the upstream session when the set of
  // ranks settles after a change, ends the ranks' sessions when it is lost,
  // reaps the sessions it replaced.
  void Run() {
    absl::MutexLock lock(&mu_);
    while (!stop_) {
      auto wake = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stop_ || upstream_.lost() || members_.changed();
      };
      mu_.AwaitWithTimeout(absl::Condition(&wake), absl::Milliseconds(200));
      if (stop_) break;
      if (upstream_.lost()) {
        EndAllLocked();
      } else if (members_.changed()) {
        // Settle: no change for config_.settle; leavers' acks drained.
        const absl::Time settled = members_.changed_at() + config_.settle;
        if (absl::Now() < settled) {
          auto stopping = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_; };
          mu_.AwaitWithDeadline(absl::Condition(&stopping), settled);
          continue;  // re-check: another change restarts the quiet time
        }
        auto drained = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
          return stop_ || upstream_.lost() || members_.LeaversDrained();
        };
        mu_.AwaitWithTimeout(absl::Condition(&drained), config_.drain);
        if (stop_ || upstream_.lost()) continue;
        std::vector<int> ranks;
        std::vector<std::string> keys;
        members_.Settle(&ranks, &keys);
        upstream_.ReopenLocked(std::move(ranks), std::move(keys),
                               forwarder_.UpstreamTokenLocked());
      }
      upstream_.ReapLocked();
    }
  }

  // The upstream session is gone: every rank registers again through us.
  void EndAllLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    upstream_.ForgetLostLocked();
    std::vector<std::shared_ptr<RankOutbox>> ending = members_.Clear();
    const grpc::Status why(grpc::StatusCode::UNAVAILABLE,
                           absl::StrCat("node relay lost its coordinator session (",
                                        upstream_.last_error(), "); register again"));
    mu_.Unlock();
    for (const auto& out : ending) out->Finish(why);
    mu_.Lock();
  }

  const NodeRelayConfig config_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  Membership members_ ABSL_GUARDED_BY(mu_);
  CallForwarder forwarder_;
  Upstream upstream_;
  // The services outlive server_ (declared after them, destroyed first).
  RankServer rank_server_;
  OperatorForwarder operator_forwarder_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::thread thread_;
};

NodeRelay::NodeRelay(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

NodeRelay::~NodeRelay() { Stop(); }

absl::StatusOr<std::unique_ptr<NodeRelay>> NodeRelay::Start(const NodeRelayConfig& config) {
  if (absl::Status s = ValidateRelayConfig(config); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = agent::SharedOrNewChannel(
      config.shared_channel, config.coordinator, config.channel);
  if (!channel.ok()) return channel.status();
  auto impl = std::make_unique<Impl>(config, *std::move(channel));
  if (absl::Status s = impl->Listen(); !s.ok()) return s;
  return std::unique_ptr<NodeRelay>(new NodeRelay(std::move(impl)));
}

const std::string& NodeRelay::address() const { return impl_->address(); }
NodeRelayStats NodeRelay::stats() const { return impl_->Stats(); }
std::vector<RankProgress> NodeRelay::progress() const { return impl_->Progress(); }
bool NodeRelay::WaitUpstreamRanks(int ranks, absl::Duration timeout) const {
  return impl_->WaitUpstreamRanks(ranks, timeout);
}
void NodeRelay::Stop() { impl_->Stop(); }

}  // namespace dynmo::relay
