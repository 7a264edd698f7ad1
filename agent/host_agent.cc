#include "agent/host_agent.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "agent/rank_state.h"
#include "agent/reconnect_loop.h"
#include "dynmo/v1/agent.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/client_callback.h"

namespace dynmo::agent {

namespace {

using dynmo::v1::HostCoordinatorMessage;
using dynmo::v1::HostMessage;

absl::Status ValidateHostConfig(const HostAgentConfig& c) {
  if (c.coordinator.empty() && c.shared_channel == nullptr) {
    return absl::InvalidArgumentError("host agent: no coordinator address");
  }
  if (c.ranks.empty()) {
    return absl::InvalidArgumentError("host agent: no ranks to host");
  }
  if (c.max_batch < 1) {
    return absl::InvalidArgumentError("host agent: max_batch must be >= 1");
  }
  absl::flat_hash_set<int> seen;
  for (const AgentConfig& r : c.ranks) {
    if (absl::Status s = ValidateRankConfig(r); !s.ok()) return s;
    if (r.job != c.ranks[0].job) {
      return absl::InvalidArgumentError(absl::StrCat(
          "host agent: ranks of two jobs ('", c.ranks[0].job, "', '", r.job,
          "') in one host session"));
    }
    if (!seen.insert(r.rank).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("host agent: rank ", r.rank, " listed twice"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace internal {

// The host's connection and its ranks' states, under one mutex.
class HostCore {
 public:
  HostCore(const HostAgentConfig& config, std::shared_ptr<grpc::Channel> channel)
      : config_(config),
        host_(config.host.empty() ? config.ranks[0].host : config.host),
        channel_(std::move(channel)),
        stub_(dynmo::v1::AgentService::NewStub(channel_)) {
    for (size_t i = 0; i < config.ranks.size(); ++i) {
      ranks_.emplace_back(config.ranks[i]);
      index_[config.ranks[i].rank] = i;
    }
  }

  void StartThread() { thread_ = std::thread([this] { Run(); }); }

  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      if (live_ctx_ != nullptr) live_ctx_->TryCancel();
    }
    if (thread_.joinable()) thread_.join();
  }

  absl::Status Report(size_t i, const IterationSample& sample) {
    absl::Status s;
    {
      absl::MutexLock lock(&mu_);
      s = ranks_[i].Report(sample);
    }
    if (s.ok()) Kick();
    return s;
  }

  std::optional<dynmo::v1::Plan> LatestCommitted(size_t i) const {
    absl::MutexLock lock(&mu_);
    return ranks_[i].LatestCommitted();
  }

  std::optional<dynmo::v1::Plan> DueAt(size_t i, int64_t iteration) {
    std::optional<dynmo::v1::Plan> plan;
    {
      absl::MutexLock lock(&mu_);
      plan = ranks_[i].DueAt(iteration);
    }
    Kick();  // a FAILED ack may have been queued
    return plan;
  }

  absl::Status Acknowledge(size_t i, uint64_t epoch, bool applied,
                           const std::string& detail) {
    absl::Status s;
    {
      absl::MutexLock lock(&mu_);
      s = ranks_[i].Acknowledge(epoch, applied, detail);
    }
    Kick();
    return s;
  }

  AgentStats Stats(size_t i) const {
    absl::MutexLock lock(&mu_);
    return ranks_[i].Stats(connected_);
  }

  bool WaitConnected(absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return connected_ || stop_;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&ready), timeout) && connected_;
  }

  bool Flush(size_t i, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto sent = [this, i]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return ranks_[i].unsent_acks() == 0 || stop_;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&sent), timeout) &&
           ranks_[i].unsent_acks() == 0;
  }

  size_t size() const { return ranks_.size(); }

 private:
  // The HostSession stream on gRPC's callback API (as Agent's Session): one
  // write outstanding at a time; Pump() builds the next HostBatch from the
  // ranks' queues, every queued ack first, then reports round-robin.
  class Session final
      : public grpc::ClientBidiReactor<HostMessage, HostCoordinatorMessage> {
   public:
    Session(HostCore* core, HostMessage hello) : core_(core) {
      out_ = std::move(hello);
      AddBearerToken(&ctx_, core_->config_.token);
      core_->stub_->async()->HostSession(&ctx_, this);
      StartRead(&in_);
      StartWrite(&out_);  // the hello; writing_ starts true
      StartCall();
    }

    grpc::ClientContext* context() { return &ctx_; }

    void Pump() {
      {
        absl::MutexLock lock(&core_->mu_);
        if (writing_ || broken_ || done_) return;
        out_.Clear();
        out_index_.clear();
        auto* batch = out_.mutable_batch();
        const size_t max = core_->config_.max_batch;
        std::vector<RankState>& ranks = core_->ranks_;
        for (size_t i = 0; i < ranks.size() && out_index_.size() < max; ++i) {
          auto& acks = ranks[i].acks();
          while (!acks.empty() && out_index_.size() < max) {
            auto* m = batch->add_messages();
            m->set_rank(ranks[i].config().rank);
            *m->mutable_ack() = std::move(acks.front());
            acks.pop_front();
            out_index_.push_back(i);
          }
        }
        for (bool progress = true; progress && out_index_.size() < max;) {
          progress = false;
          for (size_t i = 0; i < ranks.size() && out_index_.size() < max; ++i) {
            auto& reports = ranks[i].reports();
            if (reports.empty()) continue;
            auto* m = batch->add_messages();
            m->set_rank(ranks[i].config().rank);
            *m->mutable_report() = std::move(reports.front());
            reports.pop_front();
            out_index_.push_back(i);
            progress = true;
          }
        }
        if (out_index_.empty()) return;
        writing_ = true;
      }
      StartWrite(&out_);
    }

    void OnWriteDone(bool ok) override {
      {
        absl::MutexLock lock(&core_->mu_);
        writing_ = false;
        std::vector<RankState>& ranks = core_->ranks_;
        if (out_.has_batch()) {
          for (int j = 0; j < out_.batch().messages_size(); ++j) {
            RankState& r = ranks[out_index_[static_cast<size_t>(j)]];
            if (out_.batch().messages(j).has_ack()) {
              r.AckWritten();  // written, or lost with the stream
            } else if (ok) {
              ++r.counters().reports_sent;
            }
          }
        }
        if (!ok) {
          broken_ = true;  // the stream is gone; OnDone follows
          return;
        }
        if (out_.has_hello()) {
          core_->connected_ = true;
          for (RankState& r : ranks) ++r.counters().connects;
        }
      }
      Pump();
    }

    void OnReadDone(bool ok) override {
      if (!ok) {
        absl::MutexLock lock(&core_->mu_);
        broken_ = true;
        return;
      }
      {
        absl::MutexLock lock(&core_->mu_);
        for (int rank : in_.ranks()) {
          auto it = core_->index_.find(rank);
          if (it == core_->index_.end()) continue;  // not ours: ignore
          core_->ranks_[it->second].HandleDown(in_.message());
        }
      }
      Pump();  // acks go out at once
      StartRead(&in_);
    }

    void OnDone(const grpc::Status& status) override {
      {
        absl::MutexLock lock(&core_->mu_);
        core_->connected_ = false;
        if (core_->session_ == this) core_->session_ = nullptr;
        if (!status.ok() && !core_->stop_ &&
            status.error_code() != grpc::StatusCode::CANCELLED) {
          core_->SetErrorLocked(absl::StrCat("HostSession: ",
                                             status.error_message()));
        }
        done_ = true;
      }
      finished_.Notify();
    }

    bool done() const ABSL_SHARED_LOCKS_REQUIRED(core_->mu_) { return done_; }
    void WaitDone() { finished_.WaitForNotification(); }

   private:
    HostCore* core_;
    grpc::ClientContext ctx_;
    HostCoordinatorMessage in_;
    HostMessage out_;
    std::vector<size_t> out_index_;  // rank index of each batch message
    bool writing_ = true;  // guarded by core_->mu_
    bool broken_ = false;  // guarded by core_->mu_
    bool done_ = false;    // guarded by core_->mu_
    absl::Notification finished_;
  };

  void SetErrorLocked(const std::string& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (RankState& r : ranks_) r.counters().last_error = error;
  }

  // One connection: RegisterHost, then the session until it ends. True when
  // the session was established (the backoff restarts).
  bool ServeOnce() {
    dynmo::v1::RegisterHostRequest req;
    HostMessage hello;
    {
      absl::MutexLock lock(&mu_);
      hello.mutable_hello()->set_job(ranks_[0].config().job);
      hello.mutable_hello()->set_host(host_);
      for (const RankState& r : ranks_) {
        *req.add_ranks() = r.MakeRegisterRequest();
        hello.mutable_hello()->add_ranks(r.config().rank);
      }
    }
    dynmo::v1::RegisterHostResponse resp;
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + config_.rpc_timeout));
      ctx.set_wait_for_ready(true);  // see Agent::ServeOnce
      AddBearerToken(&ctx, config_.token);
      {
        absl::MutexLock lock(&mu_);
        if (stop_) return false;
        live_ctx_ = &ctx;
      }
      grpc::Status s = stub_->RegisterHost(&ctx, req, &resp);
      absl::MutexLock lock(&mu_);
      live_ctx_ = nullptr;
      if (!s.ok()) {
        if (!stop_) {
          SetErrorLocked(absl::StrCat("RegisterHost: ", s.error_message()));
          if (IsPermanentRefusal(s)) {  // retrying cannot change it
            for (RankState& r : ranks_) r.counters().gave_up = true;
            stop_ = true;
          }
        }
        return false;
      }
      for (size_t i = 0; i < ranks_.size() &&
                         static_cast<int>(i) < resp.ranks_size(); ++i) {
        ranks_[i].OnRegistered(resp.ranks(static_cast<int>(i)));
        hello.mutable_hello()->add_session_keys(ranks_[i].session_key());
      }
    }
    int64_t connects_before = 0;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return false;
      connects_before = ranks_[0].counters().connects;
    }
    // Constructed without the lock: gRPC may run a reaction inline.
    Session* session = new Session(this, std::move(hello));
    {
      absl::MutexLock lock(&mu_);
      if (!session->done()) {
        session_ = session;
        live_ctx_ = session->context();
        if (stop_) live_ctx_->TryCancel();
      }
    }
    // What was queued while session_ was still unset (the hello may have
    // been written already, so no write completion would pump it).
    Kick();
    session->WaitDone();
    absl::MutexLock lock(&mu_);
    live_ctx_ = nullptr;
    auto unkicked = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return kicking_ == 0;
    };
    mu_.Await(absl::Condition(&unkicked));
    const bool established = ranks_[0].counters().connects > connects_before;
    delete session;
    return established;
  }

  // Starts a write on the live session, if any (called after queueing).
  void Kick() {
    Session* s = nullptr;
    {
      absl::MutexLock lock(&mu_);
      s = session_;
      if (s == nullptr) return;
      ++kicking_;  // the session is not deleted while kicked
    }
    s->Pump();
    absl::MutexLock lock(&mu_);
    --kicking_;
  }

  void Run() {
    ReconnectLoop(mu_, &stop_, config_.initial_backoff, config_.max_backoff,
                  [this] { return ServeOnce(); });
  }


  const HostAgentConfig config_;
  const std::string host_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<dynmo::v1::AgentService::Stub> stub_;
  absl::flat_hash_map<int, size_t> index_;  // rank -> index; const after ctor
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* live_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  Session* session_ ABSL_GUARDED_BY(mu_) = nullptr;
  int kicking_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<RankState> ranks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace internal

absl::Status HostedRank::ReportIteration(const IterationSample& sample) {
  return core_->Report(index_, sample);
}
std::optional<dynmo::v1::Plan> HostedRank::LatestCommittedPlan() const {
  return core_->LatestCommitted(index_);
}
std::optional<dynmo::v1::Plan> HostedRank::PlanToApplyAt(int64_t iteration) {
  return core_->DueAt(index_, iteration);
}
absl::Status HostedRank::Acknowledge(uint64_t epoch, bool applied,
                                     const std::string& detail) {
  return core_->Acknowledge(index_, epoch, applied, detail);
}
AgentStats HostedRank::stats() const { return core_->Stats(index_); }
bool HostedRank::WaitConnected(absl::Duration timeout) const {
  return core_->WaitConnected(timeout);
}
bool HostedRank::Flush(absl::Duration timeout) const {
  return core_->Flush(index_, timeout);
}

HostAgent::HostAgent(std::unique_ptr<internal::HostCore> core)
    : core_(std::move(core)) {
  for (size_t i = 0; i < core_->size(); ++i) {
    ranks_.push_back(HostedRank(core_.get(), i));
  }
}

HostAgent::~HostAgent() { Stop(); }

absl::StatusOr<std::unique_ptr<HostAgent>> HostAgent::Start(
    const HostAgentConfig& config) {
  if (absl::Status s = ValidateHostConfig(config); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      SharedOrNewChannel(config.shared_channel, config.coordinator, config.channel);
  if (!channel.ok()) return channel.status();
  auto core = std::make_unique<internal::HostCore>(config, *std::move(channel));
  core->StartThread();
  return std::unique_ptr<HostAgent>(new HostAgent(std::move(core)));
}

size_t HostAgent::size() const { return ranks_.size(); }
HostedRank& HostAgent::rank(size_t index) { return ranks_.at(index); }
bool HostAgent::WaitConnected(absl::Duration timeout) const {
  return core_->WaitConnected(timeout);
}
void HostAgent::Stop() { core_->Stop(); }

}  // namespace dynmo::agent
