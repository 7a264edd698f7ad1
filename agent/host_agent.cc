#include "agent/host_agent.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/host_batch.h"
#include "agent/rank_link.h"
#include "dynmo/v1/agent.grpc.pb.h"

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

// Several ranks over one stream: RegisterHost (all or nothing), then a
// HostSession whose writes are batches of the ranks' queued messages
// (host_batch.h) and whose reads each carry one plan message for the ranks
// it lists.
class HostSessionWire final : public RankLink::Wire {
 public:
  HostSessionWire(const HostAgentConfig& config, std::shared_ptr<grpc::Channel> channel)
      : host_(config.host.empty() ? config.ranks[0].host : config.host),
        max_batch_(config.max_batch),
        stub_(dynmo::v1::AgentService::NewStub(std::move(channel))) {
    for (size_t i = 0; i < config.ranks.size(); ++i) index_[config.ranks[i].rank] = i;
  }

  const char* register_name() const override { return "RegisterHost"; }
  const char* stream_name() const override { return "HostSession"; }

  void PrepareLocked(const std::vector<RankState>& ranks) override {
    request_.Clear();
    hello_.Clear();
    hello_.mutable_hello()->set_job(ranks[0].config().job);
    hello_.mutable_hello()->set_host(host_);
    for (const RankState& r : ranks) {
      *request_.add_ranks() = r.MakeRegisterRequest();
      hello_.mutable_hello()->add_ranks(r.config().rank);
    }
  }

  grpc::Status Register(grpc::ClientContext* ctx) override {
    response_.Clear();
    return stub_->RegisterHost(ctx, request_, &response_);
  }

  void RegisteredLocked(std::vector<RankState>& ranks) override {
    for (size_t i = 0; i < ranks.size() &&
                       static_cast<int>(i) < response_.ranks_size(); ++i) {
      ranks[i].OnRegistered(response_.ranks(static_cast<int>(i)));
      hello_.mutable_hello()->add_session_keys(ranks[i].session_key());
    }
  }

  rpc::ClientStreamBase* NewStream(RankLink* link) override {
    return new Session(this, link, hello_);
  }

 private:
  class Session final : public RankLink::Stream<HostMessage, HostCoordinatorMessage> {
   public:
    Session(HostSessionWire* wire, RankLink* link, HostMessage hello)
        : Stream(link, std::move(hello),
                 [wire](grpc::ClientContext* ctx, auto* reactor) {
                   wire->stub_->async()->HostSession(ctx, reactor);
                 }),
          wire_(wire) {}

   private:
    bool NextLocked(HostMessage* out) override {
      std::vector<BatchSource> sources;
      for (RankState& r : ranks()) sources.push_back({r.config().rank, &r.queues()});
      taken_.clear();
      return FillHostBatch(sources, wire_->max_batch_, out->mutable_batch(), &taken_) > 0;
    }

    void WrittenLocked(const HostMessage& out, bool ok) override {
      for (int j = 0; j < out.batch().messages_size(); ++j) {
        RankState& r = ranks()[taken_[static_cast<size_t>(j)]];
        if (out.batch().messages(j).has_ack()) {
          r.AckWritten();  // written, or lost with the stream
        } else if (ok) {
          ++r.counters().reports_sent;
        }
      }
    }

    void OnMessage(const HostCoordinatorMessage& in) override {
      {
        absl::MutexLock lock(this->mu_);
        for (int rank : in.ranks()) {
          auto it = wire_->index_.find(rank);
          if (it == wire_->index_.end()) continue;  // not ours: ignore
          ranks()[it->second].HandleDown(in.message());
        }
      }
      Pump();  // their acks go out at once
    }

    HostSessionWire* const wire_;
    std::vector<size_t> taken_;  // rank index of each batch message
  };

  const std::string host_;
  const size_t max_batch_;
  std::unique_ptr<dynmo::v1::AgentService::Stub> stub_;
  absl::flat_hash_map<int, size_t> index_;  // rank -> index; const after ctor
  dynmo::v1::RegisterHostRequest request_;
  dynmo::v1::RegisterHostResponse response_;
  HostMessage hello_;
};

}  // namespace

HostAgent::HostAgent(std::unique_ptr<RankLink> link)
    : link_(std::move(link)) {
  for (size_t i = 0; i < link_->size(); ++i) {
    ranks_.push_back(HostedRank(link_.get(), i));
  }
}

HostAgent::~HostAgent() { Stop(); }

absl::StatusOr<std::unique_ptr<HostAgent>> HostAgent::Start(
    const HostAgentConfig& config) {
  if (absl::Status s = ValidateHostConfig(config); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      SharedOrNewChannel(config.shared_channel, config.coordinator, config.channel);
  if (!channel.ok()) return channel.status();
  auto link = std::make_unique<RankLink>(
      config.ranks,
      RankLink::Options{config.token, config.initial_backoff, config.max_backoff,
                        config.rpc_timeout},
      std::make_unique<HostSessionWire>(config, *std::move(channel)));
  link->Start();
  return std::unique_ptr<HostAgent>(new HostAgent(std::move(link)));
}

size_t HostAgent::size() const { return ranks_.size(); }
HostedRank& HostAgent::rank(size_t index) { return ranks_.at(index); }
bool HostAgent::WaitConnected(absl::Duration timeout) const {
  return link_->WaitConnected(timeout);
}
void HostAgent::Stop() { link_->Stop(); }

}  // namespace dynmo::agent
