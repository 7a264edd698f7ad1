#include "relay/upstream.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/channel.h"

namespace dynmo::relay {

using dynmo::v1::HostCoordinatorMessage;
using dynmo::v1::HostMessage;

// One HostSession for a fixed set of ranks: the relay's lock guards it.
class Upstream::HostSession final
    : public rpc::ClientStream<HostMessage, HostCoordinatorMessage> {
 public:
  HostSession(Upstream* up, std::vector<int> ranks, HostMessage hello)
      : ClientStream(up->mu_, std::move(hello),
                     [up](grpc::ClientContext* ctx, Reactor* reactor) {
                       up->stub_->async()->HostSession(ctx, reactor);
                     }),
        up_(up),
        ranks_(std::move(ranks)) {}

  const std::vector<int>& ranks() const { return ranks_; }

 private:
  bool NextLocked(HostMessage* out) override {
    if (up_->live_.get() != this) return false;  // replaced: it carries no one
    const size_t n = up_->members_->FillBatch(ranks_, up_->max_batch_, out->mutable_batch());
    up_->messages_up_ += static_cast<int64_t>(n);
    return n > 0;
  }

  void OpenedLocked() override { ++up_->sessions_; }

  void OnMessage(const HostCoordinatorMessage& in) override { up_->ToRanks(in); }

  void EndedLocked(const grpc::Status& status) override {
    if (up_->live_.get() == this && !up_->stopping_) {
      // Lost, not replaced: every rank must register again.
      up_->lost_ = true;
      up_->last_error_ = absl::StrCat("upstream HostSession: ", status.error_message());
    }
  }

  Upstream* const up_;
  const std::vector<int> ranks_;
};

Upstream::Upstream(absl::Mutex* mu, Membership* members,
                   std::shared_ptr<grpc::Channel> channel, std::string job,
                   std::string host, size_t max_batch)
    : mu_(mu),
      members_(members),
      stub_(dynmo::v1::AgentService::NewStub(std::move(channel))),
      job_(std::move(job)),
      host_(std::move(host)),
      max_batch_(max_batch) {}

Upstream::~Upstream() = default;

void Upstream::Kick() { live_.Kick(); }

void Upstream::ReopenLocked(std::vector<int> ranks, std::vector<std::string> keys,
                            const std::string& token) {
  HostSession* old = live_.get();
  live_.SetLocked(nullptr);
  if (old != nullptr) retired_.push_back(old);
  HostSession* fresh = nullptr;
  if (!ranks.empty()) {
    HostMessage hello;
    hello.mutable_hello()->set_job(job_);
    hello.mutable_hello()->set_host(host_);
    for (int r : ranks) hello.mutable_hello()->add_ranks(r);
    for (std::string& k : keys) hello.mutable_hello()->add_session_keys(std::move(k));
    fresh = new HostSession(this, std::move(ranks), std::move(hello));
    agent::AddBearerToken(fresh->context(), token);
    live_.SetLocked(fresh);
  }
  mu_->Unlock();
  // The coordinator replaces the older session of this host for the ranks
  // the new one carries; cancelling it also detaches any it alone carried.
  if (fresh != nullptr) fresh->Start();
  if (old != nullptr) old->Cancel();
  mu_->Lock();
}

void Upstream::ForgetLostLocked() {
  lost_ = false;
  ++breaks_;
  RetireLocked();
}

void Upstream::CloseLocked() {
  if (live_.get() != nullptr) live_.get()->Cancel();
  RetireLocked();
}

void Upstream::RetireLocked() {
  if (live_.get() == nullptr) return;
  retired_.push_back(live_.get());
  live_.SetLocked(nullptr);
}

void Upstream::ReapLocked() {
  if (live_.kicked()) return;
  for (auto it = retired_.begin(); it != retired_.end();) {
    if ((*it)->done()) {
      delete *it;
      it = retired_.erase(it);
    } else {
      ++it;
    }
  }
}

bool Upstream::QuietLocked() const {
  if (live_.kicked()) return false;
  for (const HostSession* s : retired_) {
    if (!s->done()) return false;
  }
  return true;
}

int Upstream::CarriedLocked() const {
  const HostSession* s = live_.get();
  return s != nullptr && s->opened() ? static_cast<int>(s->ranks().size()) : 0;
}

void Upstream::ToRanks(const HostCoordinatorMessage& m) {
  auto message = std::make_shared<const dynmo::v1::CoordinatorMessage>(m.message());
  std::vector<std::shared_ptr<RankOutbox>> to;
  {
    absl::MutexLock lock(mu_);
    to = members_->SessionsOf(m.ranks());
    messages_down_ += static_cast<int64_t>(to.size());
    ++messages_read_;
  }
  for (const auto& out : to) out->Write(message);
}

void Upstream::FillStatsLocked(NodeRelayStats* s) const {
  s->upstream_ranks = CarriedLocked();
  s->upstream_connected = s->upstream_ranks > 0;
  s->upstream_sessions = sessions_;
  s->upstream_breaks = breaks_;
  s->messages_up = messages_up_;
  s->messages_down = messages_down_;
  s->upstream_messages = messages_read_;
  s->last_error = last_error_;
}

}  // namespace dynmo::relay
