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
#include "dynmo/v1/agent.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/client_callback.h"

namespace dynmo::agent {
namespace {

using dynmo::v1::AgentMessage;
using dynmo::v1::CoordinatorMessage;
using dynmo::v1::PlanAck;

bool FiniteNonNegative(double v) { return std::isfinite(v) && v >= 0; }

absl::Status ValidateConfig(const AgentConfig& c) {
  if (c.coordinator.empty() && c.shared_channel == nullptr) {
    return absl::InvalidArgumentError("agent: no coordinator address");
  }
  if (c.job.empty()) return absl::InvalidArgumentError("agent: no job name");
  if (c.pipeline_size < 1 || c.data_parallel_size < 1) {
    return absl::InvalidArgumentError("agent: sizes must be >= 1");
  }
  if (c.pipeline_rank < 0 || c.pipeline_rank >= c.pipeline_size ||
      c.data_parallel_rank < 0 || c.data_parallel_rank >= c.data_parallel_size) {
    return absl::InvalidArgumentError("agent: coordinates out of range");
  }
  if (c.num_layers < c.pipeline_size) {
    return absl::InvalidArgumentError("agent: fewer layers than stages");
  }
  if (c.queue_capacity < 1) {
    return absl::InvalidArgumentError("agent: queue_capacity must be >= 1");
  }
  return absl::OkStatus();
}

}  // namespace

class Agent::Impl {
 public:
  Impl(const AgentConfig& config, std::shared_ptr<grpc::Channel> channel)
      : config_(config),
        channel_(std::move(channel)),
        stub_(dynmo::v1::AgentService::NewStub(channel_)) {
    boundaries_ = config.boundaries;
    for (int s = 0; s < config.pipeline_size; ++s) active_stages_.push_back(s);
  }

  void StartThread() { thread_ = std::thread([this] { Run(); }); }

  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) {
        // Already stopping; fall through to join.
      }
      stop_ = true;
      if (live_ctx_ != nullptr) live_ctx_->TryCancel();
    }
    if (thread_.joinable()) thread_.join();
  }

  absl::Status Report(const IterationSample& s) {
    if (s.iteration < 0) {
      return absl::InvalidArgumentError("sample iteration is negative");
    }
    dynmo::v1::AgentMessage m;
    auto* r = m.mutable_report();
    r->set_iteration(s.iteration);
    for (const core::LayerCost& l : s.layers) {
      if (l.id < 0 || l.id >= config_.num_layers) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layer id ", l.id, " outside [0, ", config_.num_layers, ")"));
      }
      if (!FiniteNonNegative(l.fwd_s) || !FiniteNonNegative(l.bwd_s) ||
          !FiniteNonNegative(l.wgrad_s) || l.params < 0 ||
          l.resident_bytes < 0 || l.activation_bytes < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layer ", l.id, ": times and sizes must be finite and >= 0"));
      }
      auto* ls = r->add_layers();
      ls->set_layer(l.id);
      ls->set_fwd_s(l.fwd_s);
      ls->set_bwd_s(l.bwd_s);
      ls->set_wgrad_s(l.wgrad_s);
      ls->set_params(l.params);
      ls->set_resident_bytes(l.resident_bytes);
      ls->set_activation_bytes(l.activation_bytes);
    }
    if (s.memory_used_bytes < 0 || s.memory_capacity_bytes < 0 ||
        !FiniteNonNegative(s.neighbour_wait_s)) {
      return absl::InvalidArgumentError(
          "memory must be >= 0 and neighbour_wait_s finite and >= 0");
    }
    r->set_stage_memory_used_bytes(s.memory_used_bytes);
    r->set_stage_memory_capacity_bytes(s.memory_capacity_bytes);
    r->set_neighbour_wait_s(s.neighbour_wait_s);
    r->set_model_changed(s.model_changed);
    absl::ReleasableMutexLock lock(&mu_);
    r->set_applied_epoch(applied_epoch_);
    last_iteration_ = std::max(last_iteration_, s.iteration);
    // The trainer ran the plan's apply iteration without switching.
    if (pending_ && s.iteration >= pending_->apply_iteration()) {
      FailPendingLocked("apply iteration passed without the plan applied");
    }
    {
      samples_.push_back(std::move(m));
      while (samples_.size() > config_.queue_capacity) {
        samples_.pop_front();
        ++stats_.samples_dropped;
      }
    }
    lock.Release();
    Kick();
    return absl::OkStatus();
  }

  std::optional<dynmo::v1::Plan> LatestCommitted() const {
    absl::MutexLock lock(&mu_);
    if (pending_ && committed_) return *pending_;
    return applied_plan_;
  }

  std::optional<dynmo::v1::Plan> DueAt(int64_t iteration) {
    absl::MutexLock lock(&mu_);
    if (!pending_ || pending_->apply_iteration() > iteration) return std::nullopt;
    if (pending_->apply_iteration() < iteration) {
      FailPendingLocked("apply iteration was skipped");
      return std::nullopt;
    }
    if (!committed_) {
      FailPendingLocked("not committed by its apply iteration");
      return std::nullopt;
    }
    return *pending_;
  }

  absl::Status Acknowledge(uint64_t epoch, bool applied,
                           const std::string& detail) {
    absl::MutexLock lock(&mu_);
    if (!pending_ || pending_->epoch() != epoch) {
      return absl::FailedPreconditionError(
          absl::StrCat("epoch ", epoch, " is not the pending plan"));
    }
    if (applied && !committed_) {
      return absl::FailedPreconditionError(
          absl::StrCat("epoch ", epoch, " was never committed"));
    }
    if (!applied) {
      FailPendingLocked(detail.empty() ? "the trainer did not switch" : detail);
      return absl::OkStatus();
    }
    applied_epoch_ = epoch;
    boundaries_.assign(pending_->boundaries().begin(),
                       pending_->boundaries().end());
    active_stages_.assign(pending_->active_stages().begin(),
                          pending_->active_stages().end());
    released_ = std::find(active_stages_.begin(), active_stages_.end(),
                          config_.pipeline_rank) == active_stages_.end();
    applied_plan_ = *pending_;
    pending_.reset();
    settled_epoch_ = epoch;
    settled_applied_ = true;
    ++stats_.plans_applied;
    QueueAckLocked(epoch, PlanAck::APPLIED, detail);
    return absl::OkStatus();
  }

  AgentStats Stats() const {
    absl::MutexLock lock(&mu_);
    AgentStats s = stats_;
    s.connected = connected_;
    s.applied_epoch = applied_epoch_;
    s.boundaries = boundaries_;
    s.active_stages = active_stages_;
    s.released = released_;
    return s;
  }

  bool Flush(absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto sent = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return unsent_acks_ == 0 || stop_;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&sent), timeout) && unsent_acks_ == 0;
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
  void QueueAckLocked(uint64_t epoch, PlanAck::State state,
                      const std::string& detail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    AgentMessage m;
    auto* a = m.mutable_ack();
    a->set_epoch(epoch);
    a->set_state(state);
    a->set_iteration(last_iteration_);
    a->set_detail(detail);
    control_.push_back(std::move(m));
    ++unsent_acks_;
    while (control_.size() > 256) {
      control_.pop_front();
      --unsent_acks_;
    }
  }

  void FailPendingLocked(const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t e = pending_->epoch();
    pending_.reset();
    committed_ = false;
    settled_epoch_ = e;
    settled_applied_ = false;
    ++stats_.plans_failed;
    QueueAckLocked(e, PlanAck::FAILED, why);
  }

  void HandleDownLocked(const CoordinatorMessage& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    switch (m.kind_case()) {
      case CoordinatorMessage::kPrepare: {
        const dynmo::v1::Plan& plan = m.prepare();
        const uint64_t e = plan.epoch();
        if (e <= settled_epoch_ || e <= applied_epoch_) {
          // Settled before: repeat the verdict, never act twice.
          if (e == settled_epoch_) {
            QueueAckLocked(e, settled_applied_ ? PlanAck::APPLIED
                                               : PlanAck::FAILED,
                           "duplicate");
          }
          return;
        }
        if (pending_ && pending_->epoch() == e) {
          QueueAckLocked(e, PlanAck::PREPARED, "duplicate");
          return;
        }
        if (pending_ && pending_->epoch() > e) return;  // late, stale
        if (pending_) {
          // A newer plan supersedes one never committed here.
          FailPendingLocked("superseded by a newer epoch");
        }
        if (last_iteration_ + 1 > plan.apply_iteration()) {
          settled_epoch_ = e;
          settled_applied_ = false;
          ++stats_.plans_failed;
          QueueAckLocked(e, PlanAck::FAILED,
                         absl::StrCat("already at iteration ",
                                      last_iteration_ + 1,
                                      ", past apply iteration ",
                                      plan.apply_iteration()));
          return;
        }
        pending_ = plan;
        stats_.last_prepare_epoch = e;
        stats_.last_prepare_unix_nanos = absl::ToUnixNanos(absl::Now());
        committed_ = plan.commit_with_prepare();
        if (committed_) {
          stats_.last_commit_epoch = e;
          stats_.last_commit_unix_nanos = absl::ToUnixNanos(absl::Now());
        }
        ++stats_.plans_prepared;
        QueueAckLocked(e, PlanAck::PREPARED, "");
        return;
      }
      case CoordinatorMessage::kCommit:
        if (pending_ && pending_->epoch() == m.commit().epoch() &&
            !committed_) {
          committed_ = true;
          stats_.last_commit_epoch = m.commit().epoch();
          stats_.last_commit_unix_nanos = absl::ToUnixNanos(absl::Now());
        }
        return;
      case CoordinatorMessage::kAbort:
        if (pending_ && pending_->epoch() == m.abort().epoch()) {
          pending_.reset();
          committed_ = false;
          settled_epoch_ = m.abort().epoch();
          settled_applied_ = false;
          ++stats_.plans_failed;
        }
        return;
      default:
        return;
    }
  }

  dynmo::v1::RegisterRequest RegisterRequestLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    dynmo::v1::RegisterRequest r;
    r.set_job(config_.job);
    r.set_rank(config_.rank);
    r.set_pipeline_rank(config_.pipeline_rank);
    r.set_data_parallel_rank(config_.data_parallel_rank);
    r.set_pipeline_size(config_.pipeline_size);
    r.set_data_parallel_size(config_.data_parallel_size);
    r.set_host(config_.host);
    r.set_device(config_.device);
    r.set_memory_capacity_bytes(config_.memory_capacity_bytes);
    r.set_num_layers(config_.num_layers);
    for (int b : boundaries_) r.add_boundaries(b);
    if (static_cast<int>(active_stages_.size()) != config_.pipeline_size) {
      for (int s : active_stages_) r.add_active_stages(s);
    }
    r.set_model_fingerprint(config_.model_fingerprint);
    r.set_applied_epoch(applied_epoch_);
    if (pending_) r.set_pending_epoch(pending_->epoch());
    r.set_microbatches(config_.microbatches);
    r.set_schedule(config_.schedule);
    return r;
  }

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
        if (!impl_->control_.empty()) {
          out_ = std::move(impl_->control_.front());
          impl_->control_.pop_front();
        } else if (!impl_->samples_.empty()) {
          out_ = std::move(impl_->samples_.front());
          impl_->samples_.pop_front();
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
        if (out_.has_ack()) --impl_->unsent_acks_;  // written, or lost with the stream
        if (!ok) {
          broken_ = true;  // the stream is gone; OnDone follows
          return;
        }
        if (out_.has_hello()) {
          impl_->connected_ = true;
          ++impl_->stats_.connects;
        } else if (out_.has_report()) {
          ++impl_->stats_.reports_sent;
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
        impl_->HandleDownLocked(in_);
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
          impl_->stats_.last_error =
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
      req = RegisterRequestLocked();
    }
    dynmo::v1::RegisterResponse resp;
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + config_.rpc_timeout));
      // Wait for the channel to (re)connect instead of failing fast: a
      // fail-fast call during TRANSIENT_FAILURE can abandon the connection
      // attempt, and the agent would stay offline after a restart.
      ctx.set_wait_for_ready(true);
      {
        absl::MutexLock lock(&mu_);
        if (stop_) return false;
        live_ctx_ = &ctx;
      }
      grpc::Status s = stub_->Register(&ctx, req, &resp);
      absl::MutexLock lock(&mu_);
      live_ctx_ = nullptr;
      if (!s.ok()) {
        if (!stop_) stats_.last_error = absl::StrCat("Register: ", s.error_message());
        return false;
      }
      released_ = resp.released();
    }

    AgentMessage hello;
    hello.mutable_hello()->set_job(config_.job);
    hello.mutable_hello()->set_rank(config_.rank);
    int64_t connects_before = 0;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return false;
      connects_before = stats_.connects;
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
    session->WaitDone();
    absl::MutexLock lock(&mu_);
    live_ctx_ = nullptr;
    auto unkicked = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return kicking_ == 0;
    };
    mu_.Await(absl::Condition(&unkicked));
    const bool established = stats_.connects > connects_before;
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
    absl::Duration backoff = config_.initial_backoff;
    for (;;) {
      if (ServeOnce()) backoff = config_.initial_backoff;
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      // Interruptible sleep: Stop() wakes it.
      auto stopping = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_; };
      mu_.AwaitWithTimeout(absl::Condition(&stopping), backoff);
      if (stop_) return;
      backoff = std::min(backoff * 2, config_.max_backoff);
    }
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
  std::deque<AgentMessage> samples_ ABSL_GUARDED_BY(mu_);
  std::deque<AgentMessage> control_ ABSL_GUARDED_BY(mu_);
  int64_t unsent_acks_ ABSL_GUARDED_BY(mu_) = 0;  // queued or being written
  int64_t last_iteration_ ABSL_GUARDED_BY(mu_) = -1;
  uint64_t applied_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int> boundaries_ ABSL_GUARDED_BY(mu_);
  std::vector<int> active_stages_ ABSL_GUARDED_BY(mu_);
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<dynmo::v1::Plan> pending_ ABSL_GUARDED_BY(mu_);
  bool committed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t settled_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  bool settled_applied_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<dynmo::v1::Plan> applied_plan_ ABSL_GUARDED_BY(mu_);
  AgentStats stats_ ABSL_GUARDED_BY(mu_);
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
