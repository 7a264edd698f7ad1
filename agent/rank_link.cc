#include "agent/rank_link.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/channel.h"
#include "agent/reconnect_loop.h"

namespace dynmo::agent {

RankLink::RankLink(const std::vector<AgentConfig>& ranks, Options options,
                   std::unique_ptr<Wire> wire)
    : options_(std::move(options)), wire_(std::move(wire)), size_(ranks.size()) {
  absl::MutexLock lock(&mu_);
  for (const AgentConfig& r : ranks) ranks_.emplace_back(r);
}

RankLink::~RankLink() { Stop(); }

void RankLink::Start() {
  thread_ = std::thread([this] {
    ReconnectLoop(mu_, &stop_, options_.initial_backoff, options_.max_backoff,
                  [this] { return ServeOnce(); });
  });
}

void RankLink::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (live_ctx_ != nullptr) live_ctx_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

bool RankLink::WaitConnected(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return connected_ || stop_;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&ready), timeout) && connected_;
}

bool RankLink::Flush(size_t rank, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto sent = [this, rank]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return ranks_[rank].unsent_acks() == 0 || stop_;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&sent), timeout) &&
         ranks_[rank].unsent_acks() == 0;
}

bool RankLink::ServeOnce() {
  {
    absl::MutexLock lock(&mu_);
    wire_->PrepareLocked(ranks_);
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
    // Wait for the channel to (re)connect instead of failing fast: a
    // fail-fast call during TRANSIENT_FAILURE can abandon the connection
    // attempt, and the ranks would stay offline after a restart.
    ctx.set_wait_for_ready(true);
    AddBearerToken(&ctx, options_.token);
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return false;
      live_ctx_ = &ctx;
    }
    grpc::Status s = wire_->Register(&ctx);
    absl::MutexLock lock(&mu_);
    live_ctx_ = nullptr;
    if (!s.ok()) {
      if (!stop_) {
        SetErrorLocked(absl::StrCat(wire_->register_name(), ": ", s.error_message()));
        if (IsPermanentRefusal(s)) {  // retrying cannot change it
          for (RankState& r : ranks_) r.counters().gave_up = true;
          stop_ = true;
        }
      }
      return false;
    }
    wire_->RegisteredLocked(ranks_);
    if (stop_) return false;
  }
  // Started without the lock: gRPC may run a reaction inline.
  rpc::ClientStreamBase* stream = wire_->NewStream(this);
  AddBearerToken(stream->context(), options_.token);
  stream->Start();
  {
    absl::MutexLock lock(&mu_);
    if (!stream->done()) {
      live_.SetLocked(stream);
      live_ctx_ = stream->context();
      if (stop_) live_ctx_->TryCancel();
    }
  }
  // What was queued while the stream was not yet live (the hello may have
  // been written already, so no write completion would pump it).
  live_.Kick();
  stream->WaitDone();
  absl::MutexLock lock(&mu_);
  live_ctx_ = nullptr;
  auto unkicked = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !live_.kicked(); };
  mu_.Await(absl::Condition(&unkicked));
  const bool established = stream->opened();
  delete stream;
  return established;
}

void RankLink::SetErrorLocked(const std::string& error) {
  for (RankState& r : ranks_) r.counters().last_error = error;
}

void RankLink::OpenedLocked() {
  connected_ = true;
  for (RankState& r : ranks_) ++r.counters().connects;
}

void RankLink::EndedLocked(const rpc::ClientStreamBase* stream,
                           const grpc::Status& status) {
  connected_ = false;
  live_.ForgetLocked(stream);
  if (!status.ok() && !stop_ && status.error_code() != grpc::StatusCode::CANCELLED) {
    SetErrorLocked(absl::StrCat(wire_->stream_name(), ": ", status.error_message()));
  }
}

}  // namespace dynmo::agent
