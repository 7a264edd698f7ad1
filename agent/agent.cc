#include "agent/agent.h"

#include <utility>

#include "absl/synchronization/mutex.h"
#include "agent/rank_link.h"
#include "dynmo/v1/agent.grpc.pb.h"

namespace dynmo::agent {
namespace {

using dynmo::v1::AgentMessage;
using dynmo::v1::CoordinatorMessage;

absl::Status ValidateConfig(const AgentConfig& c) {
  if (c.coordinator.empty() && c.shared_channel == nullptr) {
    return absl::InvalidArgumentError("agent: no coordinator address");
  }
  return ValidateRankConfig(c);
}

// One rank on its own: Register, then a Session stream whose writes are the
// rank's queued messages one by one, acks before reports.
class SessionWire final : public RankLink::Wire {
 public:
  explicit SessionWire(std::shared_ptr<grpc::Channel> channel)
      : stub_(dynmo::v1::AgentService::NewStub(std::move(channel))) {}

  const char* register_name() const override { return "Register"; }
  const char* stream_name() const override { return "Session"; }

  void PrepareLocked(const std::vector<RankState>& ranks) override {
    request_ = ranks[0].MakeRegisterRequest();
  }

  grpc::Status Register(grpc::ClientContext* ctx) override {
    response_.Clear();
    return stub_->Register(ctx, request_, &response_);
  }

  void RegisteredLocked(std::vector<RankState>& ranks) override {
    ranks[0].OnRegistered(response_);
    hello_.Clear();
    hello_.mutable_hello()->set_job(ranks[0].config().job);
    hello_.mutable_hello()->set_rank(ranks[0].config().rank);
    hello_.mutable_hello()->set_session_key(ranks[0].session_key());
  }

  rpc::ClientStreamBase* NewStream(RankLink* link) override {
    return new Session(link, hello_, [this](grpc::ClientContext* ctx, auto* reactor) {
      stub_->async()->Session(ctx, reactor);
    });
  }

 private:
  class Session final : public RankLink::Stream<AgentMessage, CoordinatorMessage> {
   public:
    Session(RankLink* link, AgentMessage hello, Open open)
        : Stream(link, std::move(hello), std::move(open)) {}

   private:
    bool NextLocked(AgentMessage* out) override {
      RankState& rank = ranks()[0];
      if (!rank.acks().empty()) {
        *out->mutable_ack() = std::move(rank.acks().front());
        rank.acks().pop_front();
      } else if (!rank.reports().empty()) {
        *out->mutable_report() = std::move(rank.reports().front());
        rank.reports().pop_front();
      } else {
        return false;
      }
      return true;
    }

    void WrittenLocked(const AgentMessage& out, bool ok) override {
      RankState& rank = ranks()[0];
      if (out.has_ack()) {
        rank.AckWritten();  // written, or lost with the stream
      } else if (ok) {
        ++rank.counters().reports_sent;
      }
    }

    void OnMessage(const CoordinatorMessage& in) override {
      {
        absl::MutexLock lock(this->mu_);
        ranks()[0].HandleDown(in);
      }
      Pump();  // its ack goes out at once
    }
  };

  std::unique_ptr<dynmo::v1::AgentService::Stub> stub_;
  dynmo::v1::RegisterRequest request_;
  dynmo::v1::RegisterResponse response_;
  AgentMessage hello_;
};

}  // namespace

Agent::Agent(std::unique_ptr<RankLink> link)
    : HostedRank(link.get(), 0), link_(std::move(link)) {}

Agent::~Agent() { Stop(); }

absl::StatusOr<std::unique_ptr<Agent>> Agent::Start(const AgentConfig& config) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      SharedOrNewChannel(config.shared_channel, config.coordinator, config.channel);
  if (!channel.ok()) return channel.status();
  auto link = std::make_unique<RankLink>(
      std::vector<AgentConfig>{config},
      RankLink::Options{config.token, config.initial_backoff, config.max_backoff,
                        config.rpc_timeout},
      std::make_unique<SessionWire>(*std::move(channel)));
  link->Start();
  return std::unique_ptr<Agent>(new Agent(std::move(link)));
}

void Agent::Stop() { link_->Stop(); }

}  // namespace dynmo::agent
