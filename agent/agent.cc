#include "agent/agent.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
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

using dynmo::v1::AgentMessage;
using dynmo::v1::CoordinatorMessage;
using dynmo::v1::PlanAck;

absl::Status ValidateConfig(const AgentConfig& c) {
  if (c.coordinator.empty() && c.shared_channel == nullptr) {
    return absl::InvalidArgumentError("agent: no coordinator address");
  }
  return ValidateRankConfig(c);
}

}  // namespace

// The rank's protocol state (rank_state.h, the rules HostAgent uses too)
// behind the agent's lock, and the one-rank Session transport.
class Agent::Impl {
 public:
  Impl(const AgentConfig& config, std::shared_ptr<grpc::Channel> channel)
      : config_(config),
        channel_(std::move(channel)),
        stub_(dynmo::v1::AgentService::NewStub(channel_)),
        state_(config) {}

  void StartThread() { thread_ = std::thread([this] { Run(); }); }

  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      if (live_ctx_ != nullptr) live_ctx_->TryCancel();
    }
    if (thread_.joinable()) thread_.join();
  }

  absl::Status Report(const IterationSample& s) {
    {
      absl::MutexLock lock(&mu_);
      if (absl::Status st = state_.Report(s); !st.ok()) return st;
    }
    Kick();
    return absl::OkStatus();
  }

  std::optional<dynmo::v1::Plan> LatestCommitted() const {
    absl::MutexLock lock(&mu_);
    return state_.LatestCommitted();
  }

  std::optional<dynmo::v1::Plan> DueAt(int64_t iteration) {
    absl::MutexLock lock(&mu_);
    return state_.DueAt(iteration);
  }

  absl::Status Acknowledge(uint64_t epoch, bool applied,
                           const std::string& detail) {
    absl::MutexLock lock(&mu_);
    return state_.Acknowledge(epoch, applied, detail);
  }

  AgentStats Stats() const {
    absl::MutexLock lock(&mu_);
    return state_.Stats(connected_);
  }

  bool Flush(absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto sent = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return state_.unsent_acks() == 0 || stop_;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&sent), timeout) &&
           state_.unsent_acks() == 0;
  }

  bool WaitConnected(absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return connected_ || stop_;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&ready), timeout) &&
           connected_;
  }

 private:
  // The Session stream on gRPC's callback API: reads and writes complete on
  // gRPC's threads, so an agent costs no thread while it is connected and a
  // plan message is acknowledged without a thread hop. One write is
  // outstanding at a time; Pump() starts the next from the queues (control
  // messages first, then samples). Lock: the agent's mu_.
  class Session final
      : public grpc::ClientBidiReactor<AgentMessage, CoordinatorMessage> {
   public:
    Session(Impl* impl, AgentMessage hello) : impl_(impl) {
      out_ = std::move(hello);
      AddBearerToken(&ctx_, impl_->config_.token);
      impl_->stub_->async()->Session(&ctx_, this);
      StartRead(&in_);
      StartWrite(&out_);  // the hello; writing_ starts true
      StartCall();
    }

    grpc::ClientContext* context() { return &ctx_; }

    // Starts the next write if none is outstanding.
    void Pump() {
      {
        absl::MutexLock lock(&impl_->mu_);
        if (writing_ || broken_ || done_) return;
        RankState& state = impl_->state_;
        out_.Clear();
        if (!state.acks().empty()) {
          *out_.mutable_ack() = std::move(state.acks().front());
          state.acks().pop_front();
        } else if (!state.reports().empty()) {
          *out_.mutable_report() = std::move(state.reports().front());
          state.reports().pop_front();
        } else {
          return;
        }
        writing_ = true;
      }
      StartWrite(&out_);
    }

    void OnWriteDone(bool ok) override {
      {
        absl::MutexLock lock(&impl_->mu_);
        writing_ = false;
        if (out_.has_ack()) impl_->state_.AckWritten();  // written, or lost with the stream
        if (!ok) {
          broken_ = true;  // the stream is gone; OnDone follows
          return;
        }
        if (out_.has_hello()) {
          impl_->connected_ = true;
          ++impl_->state_.counters().connects;
        } else if (out_.has_report()) {
          ++impl_->state_.counters().reports_sent;
        }
      }
      Pump();
    }

    void OnReadDone(bool ok) override {
      if (!ok) {
        absl::MutexLock lock(&impl_->mu_);
        broken_ = true;
        return;
      }
      {
        absl::MutexLock lock(&impl_->mu_);
        impl_->state_.HandleDown(in_);
      }
      Pump();  // acks go out at once
      StartRead(&in_);
    }

    void OnDone(const grpc::Status& status) override {
      {
        absl::MutexLock lock(&impl_->mu_);
        impl_->connected_ = false;
        if (impl_->session_ == this) impl_->session_ = nullptr;
        if (!status.ok() && !impl_->stop_ &&
            status.error_code() != grpc::StatusCode::CANCELLED) {
          impl_->state_.counters().last_error =
              absl::StrCat("Session: ", status.error_message());
        }
        done_ = true;
      }
      // The Run thread deletes this object once notified (Notification's
      // destructor waits for Notify to return).
      finished_.Notify();
    }

    bool done() const ABSL_SHARED_LOCKS_REQUIRED(impl_->mu_) { return done_; }

    // Blocks until OnDone ran. Waits on its own Notification, not on the
    // agent's mu_ with a condition: a waiter on mu_ would put every unlock
    // of mu_ (each report, ack and write completion) on absl's slow path,
    // evaluating the condition and waking this thread.
    void WaitDone() { finished_.WaitForNotification(); }

   private:
    Impl* impl_;
    grpc::ClientContext ctx_;
    CoordinatorMessage in_;
    AgentMessage out_;
    bool writing_ = true;  // guarded by impl_->mu_
    bool broken_ = false;  // guarded by impl_->mu_
    bool done_ = false;    // guarded by impl_->mu_
    absl::Notification finished_;
  };

  // One connection: Register, then the session until it ends. Returns true
  // when the session was established (the backoff restarts).
  bool ServeOnce() {
    dynmo::v1::RegisterRequest req;
    {
      absl::MutexLock lock(&mu_);
      req = state_.MakeRegisterRequest();
    }
    dynmo::v1::RegisterResponse resp;
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + config_.rpc_timeout));
      // Wait for the channel to (re)connect instead of failing fast: a
      // fail-fast call during TRANSIENT_FAILURE can abandon the connection
      // attempt, and the agent would stay offline after a restart.
      ctx.set_wait_for_ready(true);
      AddBearerToken(&ctx, config_.token);
      {
        absl::MutexLock lock(&mu_);
        if (stop_) return false;
        live_ctx_ = &ctx;
      }
      grpc::Status s = stub_->Register(&ctx, req, &resp);
      absl::MutexLock lock(&mu_);
      live_ctx_ = nullptr;
      if (!s.ok()) {
        if (!stop_) {
          state_.counters().last_error = absl::StrCat("Register: ", s.error_message());
        }
        return false;
      }
      state_.OnRegistered(resp);
    }

    AgentMessage hello;
    hello.mutable_hello()->set_job(config_.job);
    hello.mutable_hello()->set_rank(config_.rank);
    int64_t connects_before = 0;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return false;
      connects_before = state_.counters().connects;
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
    const bool established = state_.counters().connects > connects_before;
    delete session;
    return established;
  }

  // Starts a write on the live session, if any (called after queueing).
 public:
  void Kick() {
    Session* s = nullptr;
    {
      absl::MutexLock lock(&mu_);
      s = session_;
      if (s == nullptr) return;
      // Pump takes the lock itself; the session cannot be deleted before
      // its OnDone, which needs this lock too, and Pump is a no-op then.
      ++kicking_;
    }
    s->Pump();
    absl::MutexLock lock(&mu_);
    --kicking_;
  }

 private:

  void Run() {
    ReconnectLoop(mu_, &stop_, config_.initial_backoff, config_.max_backoff,
                  [this] { return ServeOnce(); });
  }


  const AgentConfig config_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<dynmo::v1::AgentService::Stub> stub_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* live_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  Session* session_ ABSL_GUARDED_BY(mu_) = nullptr;
  int kicking_ ABSL_GUARDED_BY(mu_) = 0;
  RankState state_ ABSL_GUARDED_BY(mu_);
};

Agent::Agent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Agent::~Agent() { Stop(); }

absl::StatusOr<std::unique_ptr<Agent>> Agent::Start(const AgentConfig& config) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  std::shared_ptr<grpc::Channel> channel = config.shared_channel;
  if (channel == nullptr) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> c =
        MakeChannel(config.coordinator, config.channel);
    if (!c.ok()) return c.status();
    channel = *c;
  }
  auto impl = std::make_unique<Impl>(config, std::move(channel));
  impl->StartThread();
  return std::unique_ptr<Agent>(new Agent(std::move(impl)));
}

absl::Status Agent::ReportIteration(const IterationSample& sample) {
  return impl_->Report(sample);
}

std::optional<dynmo::v1::Plan> Agent::LatestCommittedPlan() const {
  return impl_->LatestCommitted();
}

std::optional<dynmo::v1::Plan> Agent::PlanToApplyAt(int64_t iteration) {
  std::optional<dynmo::v1::Plan> plan = impl_->DueAt(iteration);
  impl_->Kick();  // a FAILED ack may have been queued
  return plan;
}

absl::Status Agent::Acknowledge(uint64_t epoch, bool applied,
                                const std::string& detail) {
  absl::Status s = impl_->Acknowledge(epoch, applied, detail);
  impl_->Kick();
  return s;
}

AgentStats Agent::stats() const { return impl_->Stats(); }

bool Agent::WaitConnected(absl::Duration timeout) const {
  return impl_->WaitConnected(timeout);
}

bool Agent::Flush(absl::Duration timeout) const { return impl_->Flush(timeout); }

void Agent::Stop() { impl_->Stop(); }

}  // namespace dynmo::agent
