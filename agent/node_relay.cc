#include "agent/node_relay.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "dynmo/v1/agent.grpc.pb.h"
#include "dynmo/v1/operator.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/client_callback.h"
#include "grpcpp/support/server_callback.h"
#include "rpc/stream_outbox.h"

namespace dynmo::agent {

namespace {

using dynmo::v1::AgentMessage;
using dynmo::v1::CoordinatorMessage;
using dynmo::v1::HostCoordinatorMessage;
using dynmo::v1::HostMessage;
using Outbox = rpc::StreamOutbox<AgentMessage, CoordinatorMessage>;

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

grpc::Status Refused(grpc::StatusCode code, const std::string& message) {
  return grpc::Status(code, message);
}

// The bearer token a caller presented, without the "Bearer " prefix.
std::string CallerToken(const grpc::CallbackServerContext& ctx) {
  auto it = ctx.client_metadata().find("authorization");
  if (it == ctx.client_metadata().end()) return "";
  std::string value(it->second.data(), it->second.size());
  constexpr absl::string_view kBearer = "Bearer ";
  return absl::StartsWith(value, kBearer) ? value.substr(kBearer.size()) : "";
}

}  // namespace

class NodeRelay::Impl final : public dynmo::v1::AgentService::CallbackService {
 public:
  Impl(const NodeRelayConfig& config, std::shared_ptr<grpc::Channel> channel)
      : config_(config),
        host_(config.host.empty() ? ThisHost() : config.host),
        channel_(std::move(channel)),
        stub_(dynmo::v1::AgentService::NewStub(channel_)) {}

  absl::Status Listen() {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(config_.listen, grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(this);
    operator_relay_ = std::make_unique<OperatorRelay>(this, channel_);
    builder.RegisterService(operator_relay_.get());
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || (!absl::StartsWith(config_.listen, "unix:") && port == 0)) {
      server_.reset();
      return absl::UnavailableError(
          absl::StrCat("node relay: cannot listen on ", config_.listen));
    }
    address_ = absl::StartsWith(config_.listen, "unix:")
                   ? config_.listen
                   : absl::StrCat("127.0.0.1:", port);
    thread_ = std::thread([this] { Run(); });
    return absl::OkStatus();
  }

  const std::string& address() const { return address_; }

  // ---- AgentService, downstream ----

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const dynmo::v1::RegisterRequest* request,
                                     dynmo::v1::RegisterResponse* response) override {
    if (request->job() != config_.job) {
      grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
      reactor->Finish(Refused(
          grpc::StatusCode::FAILED_PRECONDITION,
          absl::StrCat("this node relay serves job '", config_.job, "', not '",
                       request->job(), "'")));
      return reactor;
    }
    const int rank = request->rank();
    return Forward(
        context,
        [this, request, response](grpc::ClientContext* c, auto done) {
          stub_->async()->Register(c, request, response, std::move(done));
        },
        // Before the answer: the rank's Session hello may follow at once.
        [this, rank, response] {  // under mu_
          registered_[rank] = response->session_key();
          // The new registration revoked the rank's older key: a session
          // of it we still hold is stale (its agent already gave it up),
          // and must not go upstream in a hello with the revoked key.
          auto it = members_.find(rank);
          if (it != members_.end() && it->second.out != nullptr) {
            stale_.push_back(std::move(it->second.out));
            ++stats_.stale_sessions;
            MarkChangedLocked();
          }
        });
  }

  // Forwards one unary call upstream as it is (the answer or the error
  // comes back unchanged): `start(ctx, done)` starts the async call,
  // `on_ok` runs under the lock before a successful answer is sent.
  template <typename StartFn, typename OnOk>
  grpc::ServerUnaryReactor* Forward(grpc::CallbackServerContext* context,
                                    StartFn start, OnOk on_ok) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    auto* call = new grpc::ClientContext;
    call->set_deadline(std::min(context->deadline(),
                                absl::ToChronoTime(absl::Now() + config_.rpc_timeout)));
    call->set_wait_for_ready(true);
    {
      absl::MutexLock lock(&mu_);
      if (stop_) {
        delete call;
        reactor->Finish(Refused(grpc::StatusCode::UNAVAILABLE,
                                "node relay is stopping"));
        return reactor;
      }
      if (config_.token.empty()) {
        if (std::string t = CallerToken(*context); !t.empty()) caller_token_ = t;
      }
      AddBearerToken(call, UpstreamTokenLocked());
      forwarding_.insert(call);
    }
    start(call, [this, call, reactor, on_ok](grpc::Status s) {
      if (s.ok()) {
        absl::MutexLock lock(&mu_);
        on_ok();
      }
      FinishStale();
      reactor->Finish(s);
      {
        absl::MutexLock lock(&mu_);
        forwarding_.erase(call);
      }
      delete call;
    });
    return reactor;
  }

  // OperatorService for the node's ranks (dynmo-train sets its job's
  // policy and polls it), each call forwarded as it is.
  class OperatorRelay final : public dynmo::v1::OperatorService::CallbackService {
   public:
    explicit OperatorRelay(Impl* relay, std::shared_ptr<grpc::Channel> channel)
        : relay_(relay), stub_(dynmo::v1::OperatorService::NewStub(channel)) {}

#define DYNMO_RELAY_FORWARD(Method, Req, Resp)                                  \
  grpc::ServerUnaryReactor* Method(grpc::CallbackServerContext* context,        \
                                   const dynmo::v1::Req* request,               \
                                   dynmo::v1::Resp* response) override {        \
    return relay_->Forward(                                                     \
        context,                                                                \
        [this, request, response](grpc::ClientContext* c, auto done) {          \
          stub_->async()->Method(c, request, response, std::move(done));        \
        },                                                                      \
        [] {});                                                                 \
  }
    DYNMO_RELAY_FORWARD(ListJobs, ListJobsRequest, ListJobsResponse)
    DYNMO_RELAY_FORWARD(GetJob, GetJobRequest, JobStatus)
    DYNMO_RELAY_FORWARD(SetPolicy, SetPolicyRequest, SetPolicyResponse)
    DYNMO_RELAY_FORWARD(Rebalance, RebalanceRequest, RebalanceResponse)
    DYNMO_RELAY_FORWARD(DeleteJob, DeleteJobRequest, DeleteJobResponse)
#undef DYNMO_RELAY_FORWARD

   private:
    Impl* relay_;
    std::unique_ptr<dynmo::v1::OperatorService::Stub> stub_;
  };

  grpc::ServerBidiReactor<AgentMessage, CoordinatorMessage>* Session(
      grpc::CallbackServerContext* /*context*/) override {
    return new DownSession(this);
  }

  // ---- control ----

  NodeRelayStats Stats() const {
    absl::MutexLock lock(&mu_);
    NodeRelayStats s = stats_;
    s.registered_ranks = static_cast<int>(registered_.size());
    s.attached_ranks = 0;
    for (const auto& [rank, m] : members_) s.attached_ranks += m.out != nullptr;
    s.upstream_ranks = current_ != nullptr && current_->established()
                           ? static_cast<int>(current_->ranks().size())
                           : 0;
    s.upstream_connected = s.upstream_ranks > 0;
    return s;
  }

  std::vector<RankProgress> Progress() const {
    absl::MutexLock lock(&mu_);
    std::vector<RankProgress> out;
    for (const auto& [rank, p] : progress_) out.push_back(p);
    std::sort(out.begin(), out.end(),
              [](const RankProgress& a, const RankProgress& b) { return a.rank < b.rank; });
    return out;
  }

  bool WaitUpstreamRanks(int ranks, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto carried = [this, ranks]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stop_ || (current_ != nullptr && current_->established() &&
                       static_cast<int>(current_->ranks().size()) == ranks);
    };
    return mu_.AwaitWithTimeout(absl::Condition(&carried), timeout) && !stop_;
  }

  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return;
      stop_ = stopped_ = true;
      for (grpc::ClientContext* c : forwarding_) c->TryCancel();
    }
    // Ends the ranks' sessions; their OnDone still reaches this object.
    if (server_ != nullptr) {
      server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Milliseconds(200)));
    }
    if (thread_.joinable()) thread_.join();
    absl::MutexLock lock(&mu_);
    if (current_ != nullptr) {
      current_->Cancel();
      retired_.push_back(current_);
      current_ = nullptr;
    }
    auto quiet = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      if (!forwarding_.empty() || kicking_ > 0) return false;
      for (UpSession* s : retired_) {
        if (!s->done()) return false;
      }
      return true;
    };
    mu_.Await(absl::Condition(&quiet));
    for (UpSession* s : retired_) delete s;
    retired_.clear();
  }

 private:
  // One rank's Session: hello binds it; reports and acks are queued for the
  // upstream session; plan messages come in through `out`.
  class DownSession final
      : public grpc::ServerBidiReactor<AgentMessage, CoordinatorMessage> {
   public:
    explicit DownSession(Impl* relay)
        : relay_(relay), out_(std::make_shared<Outbox>(this)) {
      StartRead(&in_);
    }

    void OnReadDone(bool ok) override {
      if (!ok) {
        out_->Finish(grpc::Status::OK);  // the rank closed or the link broke
        return;
      }
      absl::Status s = relay_->FromRank(&rank_, out_, in_);
      if (!s.ok()) {
        out_->Finish(Refused(static_cast<grpc::StatusCode>(s.code()),
                             std::string(s.message())));
        return;
      }
      if (!out_->finishing()) StartRead(&in_);
    }

    void OnWriteDone(bool ok) override { out_->OnWriteDone(ok); }

    void OnDone() override {
      if (rank_ >= 0) relay_->Leave(rank_, out_.get());
      out_->Detach();
      delete this;
    }

   private:
    Impl* relay_;
    std::shared_ptr<Outbox> out_;
    AgentMessage in_;
    int rank_ = -1;  // set by the hello
  };

  // The one HostSession upstream, for a fixed set of ranks.
  class UpSession final
      : public grpc::ClientBidiReactor<HostMessage, HostCoordinatorMessage> {
   public:
    UpSession(Impl* relay, std::vector<int> ranks, std::vector<std::string> keys)
        : relay_(relay), ranks_(std::move(ranks)) {
      auto* hello = out_.mutable_hello();
      hello->set_job(relay_->config_.job);
      hello->set_host(relay_->host_);
      for (int r : ranks_) hello->add_ranks(r);
      for (std::string& k : keys) hello->add_session_keys(std::move(k));
    }

    // Starts the call; reactions may run before it returns.
    void Start(const std::string& token) {
      AddBearerToken(&ctx_, token);
      relay_->stub_->async()->HostSession(&ctx_, this);
      StartRead(&in_);
      StartWrite(&out_);  // the hello; writing_ starts true
      StartCall();
    }

    void Cancel() { ctx_.TryCancel(); }

    const std::vector<int>& ranks() const { return ranks_; }
    bool established() const ABSL_SHARED_LOCKS_REQUIRED(relay_->mu_) {
      return established_;
    }
    bool done() const ABSL_SHARED_LOCKS_REQUIRED(relay_->mu_) { return done_; }

    // Writes the next batch of the carried ranks' queued messages, if idle.
    void Pump() {
      {
        absl::MutexLock lock(&relay_->mu_);
        if (writing_ || broken_ || done_ || relay_->current_ != this) return;
        out_.Clear();
        const size_t n = relay_->FillBatchLocked(ranks_, out_.mutable_batch());
        if (n == 0) return;
        relay_->stats_.messages_up += static_cast<int64_t>(n);
        writing_ = true;
      }
      StartWrite(&out_);
    }

    void OnWriteDone(bool ok) override {
      {
        absl::MutexLock lock(&relay_->mu_);
        writing_ = false;
        if (!ok) {
          broken_ = true;  // OnDone follows
          return;
        }
        if (out_.has_hello()) {
          established_ = true;
          ++relay_->stats_.upstream_sessions;
        }
      }
      Pump();
    }

    void OnReadDone(bool ok) override {
      if (!ok) {
        absl::MutexLock lock(&relay_->mu_);
        broken_ = true;
        return;
      }
      relay_->ToRanks(in_);
      StartRead(&in_);
    }

    void OnDone(const grpc::Status& status) override {
      absl::MutexLock lock(&relay_->mu_);
      done_ = true;
      if (relay_->current_ == this && !relay_->stop_) {
        // Lost, not replaced: every rank must re-register (Run()).
        relay_->lost_ = true;
        relay_->stats_.last_error =
            absl::StrCat("upstream HostSession: ", status.error_message());
      }
    }

   private:
    Impl* relay_;
    const std::vector<int> ranks_;
    grpc::ClientContext ctx_;
    HostCoordinatorMessage in_;
    HostMessage out_;
    // Guarded by relay_->mu_.
    bool writing_ = true;
    bool broken_ = false;
    bool established_ = false;
    bool done_ = false;
  };

  // A rank's session and its messages waiting to go upstream.
  struct Member {
    std::shared_ptr<Outbox> out;  // null once the rank's session ended
    std::string session_key;      // the rank's, from its hello
    std::deque<dynmo::v1::PlanAck> acks;
    std::deque<dynmo::v1::IterationReport> reports;
  };

  // Ends the rank sessions a newer registration made stale.
  void FinishStale() {
    std::vector<std::shared_ptr<Outbox>> stale;
    {
      absl::MutexLock lock(&mu_);
      stale.swap(stale_);
    }
    for (const auto& out : stale) {
      out->Finish(Refused(grpc::StatusCode::ABORTED,
                          "the rank registered again: this session is stale"));
    }
  }

  std::string UpstreamTokenLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return config_.token.empty() ? caller_token_ : config_.token;
  }

  // A message from a rank's session (the caller's `rank` is -1 until its
  // hello binds it).
  absl::Status FromRank(int* rank, const std::shared_ptr<Outbox>& out,
                        const AgentMessage& m) {
    std::shared_ptr<Outbox> replaced;
    {
      absl::MutexLock lock(&mu_);
      if (*rank < 0) {
        if (!m.has_hello()) {
          return absl::InvalidArgumentError(
              "the first Session message must be hello{job, rank}");
        }
        if (m.hello().job() != config_.job) {
          return absl::FailedPreconditionError(
              absl::StrCat("this node relay serves job '", config_.job,
                           "', not '", m.hello().job(), "'"));
        }
        const int r = m.hello().rank();
        auto reg = registered_.find(r);
        if (reg == registered_.end()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "rank ", r, " of job ", config_.job,
              " must call Register (through this relay) before opening a session"));
        }
        if (m.hello().session_key() != reg->second) {
          return absl::PermissionDeniedError(absl::StrCat(
              "the session key of rank ", r,
              " is not the one its newest Register issued (register again)"));
        }
        Member& member = members_[r];
        replaced = std::move(member.out);
        member.out = out;
        member.session_key = m.hello().session_key();
        ++stats_.rank_sessions;
        *rank = r;
        MarkChangedLocked();
      } else if (m.has_report()) {
        RankProgress& p = progress_[*rank];
        p.rank = *rank;
        p.last_iteration = std::max(p.last_iteration, m.report().iteration());
        p.last_report = absl::Now();
        Member& member = members_[*rank];
        member.reports.push_back(m.report());
        if (member.reports.size() > config_.report_queue_capacity) {
          member.reports.pop_front();
          ++stats_.reports_dropped;
        }
      } else if (m.has_ack()) {
        members_[*rank].acks.push_back(m.ack());
      } else if (m.has_hello()) {
        return absl::InvalidArgumentError("hello sent twice on one session");
      } else {
        return absl::InvalidArgumentError("empty Session message");
      }
    }
    if (replaced != nullptr && replaced != out) {
      replaced->Finish(Refused(grpc::StatusCode::ABORTED,
                               absl::StrCat("replaced by a newer session of rank ",
                                            *rank)));
    }
    Kick();
    return absl::OkStatus();
  }

  void Leave(int rank, const Outbox* out) {
    absl::MutexLock lock(&mu_);
    auto it = members_.find(rank);
    if (it == members_.end() || it->second.out.get() != out) return;
    it->second.out = nullptr;
    ++stats_.rank_sessions_ended;
    MarkChangedLocked();
  }

  void MarkChangedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    changed_ = true;
    changed_at_ = absl::Now();
  }

  // Moves queued messages of `ranks` into `batch`: every ack first, then
  // reports round-robin, at most max_batch. Returns how many.
  size_t FillBatchLocked(const std::vector<int>& ranks, dynmo::v1::HostBatch* batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const size_t max = config_.max_batch;
    size_t n = 0;
    for (int r : ranks) {
      auto it = members_.find(r);
      if (it == members_.end()) continue;
      for (auto& acks = it->second.acks; !acks.empty() && n < max; ++n) {
        auto* m = batch->add_messages();
        m->set_rank(r);
        *m->mutable_ack() = std::move(acks.front());
        acks.pop_front();
      }
    }
    for (bool progress = true; progress && n < max;) {
      progress = false;
      for (int r : ranks) {
        if (n == max) break;
        auto it = members_.find(r);
        if (it == members_.end() || it->second.reports.empty()) continue;
        auto* m = batch->add_messages();
        m->set_rank(r);
        *m->mutable_report() = std::move(it->second.reports.front());
        it->second.reports.pop_front();
        ++n;
        progress = true;
      }
    }
    return n;
  }

  // A plan message from upstream, to each listed rank's session.
  void ToRanks(const HostCoordinatorMessage& m) {
    auto message = std::make_shared<const CoordinatorMessage>(m.message());
    std::vector<std::shared_ptr<Outbox>> to;
    {
      absl::MutexLock lock(&mu_);
      for (int r : m.ranks()) {
        auto it = members_.find(r);
        if (it != members_.end() && it->second.out != nullptr) {
          to.push_back(it->second.out);
        }
      }
      stats_.messages_down += static_cast<int64_t>(to.size());
      ++stats_.upstream_messages;
    }
    for (const auto& out : to) out->Write(message);
  }

  // Starts a write on the live upstream session, if any.
  void Kick() {
    UpSession* s = nullptr;
    {
      absl::MutexLock lock(&mu_);
      s = current_;
      if (s == nullptr) return;
      ++kicking_;  // not deleted while kicked
    }
    s->Pump();
    absl::MutexLock lock(&mu_);
    --kicking_;
  }

  bool QueuesOfLeaversEmptyLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    for (const auto& [rank, m] : members_) {
      if (m.out == nullptr && !m.acks.empty()) return false;
    }
    return true;
  }

  // The background thread: re-opens the upstream session when the set of
  // ranks changes, ends the ranks' sessions when it is lost, reaps.
  void Run() {
    absl::MutexLock lock(&mu_);
    while (!stop_) {
      auto wake = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stop_ || lost_ || changed_;
      };
      mu_.AwaitWithTimeout(absl::Condition(&wake), absl::Milliseconds(200));
      if (stop_) break;
      if (lost_) {
        EndAllLocked();
      } else if (changed_) {
        // Settle: no change for config_.settle; leavers' acks drained.
        const absl::Time settled = changed_at_ + config_.settle;
        if (absl::Now() < settled) {
          auto stopping = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_; };
          mu_.AwaitWithDeadline(absl::Condition(&stopping), settled);
          continue;  // re-check: another change restarts the quiet time
        }
        auto drained = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
          return stop_ || lost_ || QueuesOfLeaversEmptyLocked();
        };
        mu_.AwaitWithTimeout(absl::Condition(&drained), config_.drain);
        if (stop_ || lost_) continue;
        changed_ = false;
        ReopenLocked();
      }
      ReapLocked();
    }
  }

  // The upstream session is gone: every rank re-registers through us.
  void EndAllLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    lost_ = false;
    changed_ = false;
    ++stats_.upstream_breaks;
    if (current_ != nullptr) {
      retired_.push_back(current_);
      current_ = nullptr;
    }
    std::vector<std::shared_ptr<Outbox>> ending;
    for (auto& [rank, m] : members_) {
      if (m.out != nullptr) ending.push_back(std::move(m.out));
    }
    members_.clear();
    registered_.clear();
    const grpc::Status why(grpc::StatusCode::UNAVAILABLE,
                           absl::StrCat("node relay lost its coordinator session (",
                                        stats_.last_error, "); register again"));
    mu_.Unlock();
    for (const auto& out : ending) out->Finish(why);
    mu_.Lock();
  }

  void ReopenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<int> ranks;
    for (auto it = members_.begin(); it != members_.end();) {
      if (it->second.out == nullptr) {
        members_.erase(it++);  // left, and its last acks went (or timed out)
      } else {
        ranks.push_back(it->first);
        ++it;
      }
    }
    std::sort(ranks.begin(), ranks.end());
    std::vector<std::string> keys;
    for (int r : ranks) keys.push_back(members_[r].session_key);
    UpSession* old = current_;
    current_ = nullptr;
    if (old != nullptr) retired_.push_back(old);
    UpSession* fresh = nullptr;
    if (!ranks.empty()) {
      fresh = new UpSession(this, std::move(ranks), std::move(keys));
      current_ = fresh;
    }
    const std::string token = UpstreamTokenLocked();
    mu_.Unlock();
    // The coordinator replaces the older session of this host for the ranks
    // the new one carries; cancelling it also detaches any it alone carried.
    if (fresh != nullptr) fresh->Start(token);
    if (old != nullptr) old->Cancel();
    mu_.Lock();
  }

  void ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (kicking_ > 0) return;
    for (auto it = retired_.begin(); it != retired_.end();) {
      if ((*it)->done()) {
        delete *it;
        it = retired_.erase(it);
      } else {
        ++it;
      }
    }
  }

  const NodeRelayConfig config_;
  const std::string host_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<dynmo::v1::AgentService::Stub> stub_;
  std::unique_ptr<OperatorRelay> operator_relay_;  // outlives server_
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;     // the live upstream ended
  bool changed_ ABSL_GUARDED_BY(mu_) = false;  // ranks attached or left
  absl::Time changed_at_ ABSL_GUARDED_BY(mu_);
  std::string caller_token_ ABSL_GUARDED_BY(mu_);
  // Ranks registered through us since the last break, with their keys.
  absl::flat_hash_map<int, std::string> registered_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<grpc::ClientContext*> forwarding_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, Member> members_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Outbox>> stale_ ABSL_GUARDED_BY(mu_);  // FinishStale
  // Kept across sessions and upstream breaks: progress is the rank's.
  absl::flat_hash_map<int, RankProgress> progress_ ABSL_GUARDED_BY(mu_);
  UpSession* current_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<UpSession*> retired_ ABSL_GUARDED_BY(mu_);
  int kicking_ ABSL_GUARDED_BY(mu_) = 0;
  NodeRelayStats stats_ ABSL_GUARDED_BY(mu_);
};

NodeRelay::NodeRelay(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

NodeRelay::~NodeRelay() { Stop(); }

absl::StatusOr<std::unique_ptr<NodeRelay>> NodeRelay::Start(
    const NodeRelayConfig& config) {
  if (absl::Status s = ValidateRelayConfig(config); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      SharedOrNewChannel(config.shared_channel, config.coordinator, config.channel);
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

}  // namespace dynmo::agent
