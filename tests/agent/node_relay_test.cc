// NodeRelay between ordinary Agents and an embedded coordinator, over a
// Unix-domain socket: ranks behind the relay get the same plans at the
// same iterations as ranks with direct sessions, on one upstream stream; a
// lost coordinator makes every rank re-register through the relay; a rank
// that leaves is dropped from the upstream session; what the relay must
// refuse it refuses with a clear status.
#include "relay/node_relay.h"

#include <stdlib.h>
#include <unistd.h>

#include <map>
#include <tuple>

#include "agent/agent.h"
#include "agent/operator_client.h"
#include "core/partition.h"
#include "coordinator/service/embedded_coordinator.h"
#include "dynmo/v1/agent.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tests/agent/test_coordinator.h"

namespace dynmo::agent {
namespace {

using relay::NodeRelay;
using relay::NodeRelayConfig;
using relay::NodeRelayStats;
using service::EmbeddedCoordinator;

constexpr int kStages = 4;
constexpr int kReplicas = 2;  // 8 ranks, one node: rank = replica * kStages + stage
constexpr int kRanks = kStages * kReplicas;
constexpr int kLayers = 12;
constexpr char kJob[] = "relay";


// A private directory for the relay's socket, removed at the end.
class SocketDir {
 public:
  SocketDir() {
    char tmpl[] = "/tmp/dynmo-relay-test-XXXXXX";
    path_ = mkdtemp(tmpl) != nullptr ? tmpl : "/tmp";
  }
  ~SocketDir() {
    unlink((path_ + "/relay.sock").c_str());
    rmdir(path_.c_str());
  }
  std::string socket() const { return "unix:" + path_ + "/relay.sock"; }

 private:
  std::string path_;
};

std::unique_ptr<NodeRelay> StartRelay(const std::string& coordinator,
                                      const std::string& listen) {
  NodeRelayConfig c;
  c.listen = listen;
  c.coordinator = coordinator;
  c.job = kJob;
  c.host = "node0";
  auto r = NodeRelay::Start(c);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : nullptr;
}

AgentConfig RankConfig(const std::string& address, int rank) {
  AgentConfig c;
  c.coordinator = address;
  c.job = kJob;
  c.rank = rank;
  c.pipeline_rank = rank % kStages;
  c.data_parallel_rank = rank / kStages;
  c.pipeline_size = kStages;
  c.data_parallel_size = kReplicas;
  c.num_layers = kLayers;
  c.host = "node0";
  c.device = rank;
  c.initial_backoff = absl::Milliseconds(20);
  c.max_backoff = absl::Milliseconds(200);
  return c;
}

std::vector<std::unique_ptr<Agent>> StartAgents(const std::string& address) {
  std::vector<std::unique_ptr<Agent>> agents;
  for (int r = 0; r < kRanks; ++r) {
    auto a = Agent::Start(RankConfig(address, r));
    EXPECT_TRUE(a.ok()) << a.status();
    if (a.ok()) agents.push_back(*std::move(a));
  }
  for (auto& a : agents) EXPECT_TRUE(a->WaitConnected(absl::Seconds(10)));
  return agents;
}

// Before iteration `switch_at` layers 0..2 cost 5x the others, after it
// layers 9..11 do: each phase wants a different layout.
IterationSample Sample(int64_t k, const std::vector<int>& b, int stage, int64_t switch_at) {
  IterationSample s;
  s.iteration = k;
  for (int l = b[static_cast<size_t>(stage)]; l < b[static_cast<size_t>(stage) + 1]; ++l) {
    core::LayerCost c;
    c.id = l;
    const bool heavy = k < switch_at ? l < 3 : l >= 9;
    c.fwd_s = heavy ? 0.005 : 0.001;
    c.bwd_s = 2 * c.fwd_s;
    s.layers.push_back(c);
  }
  return s;
}

std::shared_ptr<service::JobState> Job(EmbeddedCoordinator& c) {
  auto job = c.server().coordinator().jobs().Find(kJob);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *job : nullptr;
}

template <typename Pred>
bool Eventually(Pred pred, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time end = absl::Now() + timeout;
  while (!pred()) {
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

// A coordinator, a relay in front of it and kRanks agents behind the relay,
// every rank carried by the relay's upstream session.
struct RelayedJob {
  std::unique_ptr<EmbeddedCoordinator> coord;
  SocketDir dir;
  std::unique_ptr<NodeRelay> relay;
  std::vector<std::unique_ptr<Agent>> agents;  // destroyed first

  bool Start() {
    coord = StartTestCoordinator("manual");
    if (coord == nullptr) return false;
    relay = StartRelay(coord->address(), dir.socket());
    if (relay == nullptr) return false;
    agents = StartAgents(relay->address());
    return agents.size() == static_cast<size_t>(kRanks) &&
           relay->WaitUpstreamRanks(kRanks, absl::Seconds(10));
  }
};

// (epoch, iteration switched at, boundaries) of each applied plan.
using Applied = std::tuple<uint64_t, int64_t, std::vector<int>>;

// A lock-step trainer loop of all ranks that asks the coordinator for a
// plan at iterations 9 and 29, each time once every report before it was
// counted, so what is decided does not depend on timing.
std::vector<Applied> TrainInLockStep(EmbeddedCoordinator& coord,
                                     std::vector<std::unique_ptr<Agent>>& agents) {
  std::vector<Applied> applied;
  std::vector<int> b = core::PartitionUniform(kLayers, kStages);
  std::shared_ptr<service::JobState> job = Job(coord);
  if (job == nullptr) return applied;
  const int64_t reports_before = job->Summary().reports();
  constexpr int64_t kSwitchAt = 20;
  for (int64_t k = 0; k < 45; ++k) {
    std::vector<std::optional<wire::Plan>> due;
    for (auto& a : agents) due.push_back(a->PlanToApplyAt(k));
    bool all = true;
    for (auto& d : due) all = all && d && d->epoch == due[0]->epoch;
    for (size_t r = 0; r < agents.size(); ++r) {
      if (due[r]) {
        EXPECT_TRUE(agents[r]->Acknowledge(due[r]->epoch, all).ok());
      }
    }
    if (all) {
      b.assign(due[0]->boundaries.begin(), due[0]->boundaries.end());
      applied.emplace_back(due[0]->epoch, k, b);
    }
    for (size_t r = 0; r < agents.size(); ++r) {
      EXPECT_TRUE(agents[r]->ReportIteration(
          Sample(k, b, static_cast<int>(r) % kStages, kSwitchAt)).ok());
    }
    const int64_t want = reports_before + kRanks * (k + 1);
    EXPECT_TRUE(Eventually([&] { return job->Summary().reports() >= want; }))
        << "reports of iteration " << k << " did not arrive: " << job->Summary().reports()
        << " of " << want << "; agent 0: connects " << agents[0]->stats().connects
        << ", sent " << agents[0]->stats().reports_sent << ", error '"
        << agents[0]->stats().last_error << "'";
    if (k == 9 || k == 29) {
      auto r = job->Rebalance(absl::Now());
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok() || !r->issued()) continue;
      const uint64_t epoch = r->plan().epoch();
      EXPECT_TRUE(Eventually([&] {
        for (auto& a : agents) {
          auto p = a->LatestCommittedPlan();
          if (!p || p->epoch != epoch) return false;
        }
        return true;
      })) << "plan " << epoch << " was not committed at every rank";
    }
  }
  return applied;
}

TEST(NodeRelayTest, RanksBehindTheRelayGetTheSamePlansAtTheSameIterationsAsDirectOnes) {
  std::vector<Applied> direct;
  {
    auto coord = StartTestCoordinator("manual");
    ASSERT_NE(coord, nullptr);
    auto agents = StartAgents(coord->address());
    ASSERT_EQ(agents.size(), static_cast<size_t>(kRanks));
    direct = TrainInLockStep(*coord, agents);
  }
  ASSERT_EQ(direct.size(), 2u) << "two plans applied with direct sessions";

  auto coord = StartTestCoordinator("manual");
  ASSERT_NE(coord, nullptr);
  SocketDir dir;
  auto relay = StartRelay(coord->address(), dir.socket());
  ASSERT_NE(relay, nullptr);
  EXPECT_EQ(relay->address(), dir.socket());
  auto agents = StartAgents(relay->address());
  ASSERT_EQ(agents.size(), static_cast<size_t>(kRanks));
  ASSERT_TRUE(relay->WaitUpstreamRanks(kRanks, absl::Seconds(10)));
  std::shared_ptr<service::JobState> job = Job(*coord);
  ASSERT_NE(job, nullptr);
  ASSERT_TRUE(Eventually([&] { return job->Summary().connected_ranks() == kRanks; }));
  const std::vector<Applied> relayed = TrainInLockStep(*coord, agents);
  EXPECT_EQ(relayed, direct);

  const NodeRelayStats s = relay->stats();
  EXPECT_EQ(s.upstream_ranks, kRanks) << "one upstream stream carries all ranks";
  EXPECT_GE(s.upstream_sessions, 1);
  EXPECT_EQ(s.upstream_breaks, 0);
  EXPECT_GE(s.messages_up, kRanks * 45);
  EXPECT_GT(s.messages_down, 0);
  for (auto& a : agents) {
    AgentStats st = a->stats();
    EXPECT_EQ(st.plans_applied, 2);
    EXPECT_EQ(st.plans_failed, 0);
  }
}

TEST(NodeRelayTest, ALostCoordinatorMakesEveryRankReRegisterThroughTheRelay) {
  auto first = StartTestCoordinator("manual");
  ASSERT_NE(first, nullptr);
  const std::string address = first->address();
  SocketDir dir;
  auto relay = StartRelay(address, dir.socket());
  ASSERT_NE(relay, nullptr);
  auto agents = StartAgents(relay->address());
  ASSERT_EQ(agents.size(), static_cast<size_t>(kRanks));
  ASSERT_TRUE(relay->WaitUpstreamRanks(kRanks, absl::Seconds(10)));

  first->Shutdown();
  first.reset();
  ASSERT_TRUE(Eventually([&] { return !agents[0]->stats().connected; }))
      << "the relay ends the ranks' sessions when its upstream is lost";
  auto second = StartTestCoordinator("manual", false, address);
  ASSERT_NE(second, nullptr);
  for (auto& a : agents) ASSERT_TRUE(a->WaitConnected(absl::Seconds(10)));
  ASSERT_TRUE(relay->WaitUpstreamRanks(kRanks, absl::Seconds(10)));
  for (auto& a : agents) EXPECT_GE(a->stats().connects, 2);
  EXPECT_GE(relay->stats().upstream_breaks, 1);
  std::shared_ptr<service::JobState> job = Job(*second);
  ASSERT_NE(job, nullptr);
  EXPECT_EQ(job->Record().ranks_size(), kRanks) << "every rank re-registered";
  EXPECT_TRUE(Eventually([&] { return job->Summary().connected_ranks() == kRanks; }));
}

TEST(NodeRelayTest, ARankThatLeavesIsDroppedFromTheUpstreamSession) {
  RelayedJob j;
  ASSERT_TRUE(j.Start());
  j.agents.back()->Stop();
  ASSERT_TRUE(j.relay->WaitUpstreamRanks(kRanks - 1, absl::Seconds(10)));
  std::shared_ptr<service::JobState> job = Job(*j.coord);
  ASSERT_NE(job, nullptr);
  EXPECT_TRUE(Eventually([&] { return job->Summary().connected_ranks() == kRanks - 1; }));
  EXPECT_EQ(j.relay->stats().attached_ranks, kRanks - 1);
}

TEST(NodeRelayTest, ForwardsTheOperatorCallsOfARank) {
  RelayedJob j;
  ASSERT_TRUE(j.Start());
  auto client = OperatorClient::Connect(j.relay->address(), ChannelOptions{});
  ASSERT_TRUE(client.ok()) << client.status();
  JobPolicy policy;
  policy.trigger = "every:7";
  EXPECT_TRUE(client->SetPolicy(kJob, policy).ok());
  std::shared_ptr<service::JobState> job = Job(*j.coord);
  ASSERT_NE(job, nullptr);
  EXPECT_EQ(job->Summary().policy().trigger(), "every:7");
  // The relay's hello is written; the coordinator binds the ranks when it
  // has read it.
  EXPECT_TRUE(Eventually([&] {
    auto connected = client->ConnectedRanks(kJob);
    return connected.ok() && *connected == kRanks;
  }));
  // The coordinator's refusal comes back as it is.
  policy.trigger = "sometimes";
  EXPECT_EQ(client->SetPolicy(kJob, policy).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->ConnectedRanks("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(NodeRelayTest, RefusesWhatItCannotRelayWithAClearStatus) {
  auto coord = StartTestCoordinator("manual");
  ASSERT_NE(coord, nullptr);
  SocketDir dir;
  auto relay = StartRelay(coord->address(), dir.socket());
  ASSERT_NE(relay, nullptr);
  auto stub = dynmo::v1::AgentService::NewStub(
      grpc::CreateChannel(relay->address(), grpc::InsecureChannelCredentials()));

  {  // another job
    grpc::ClientContext ctx;
    dynmo::v1::RegisterRequest req;
    req.set_job("other");
    dynmo::v1::RegisterResponse resp;
    grpc::Status s = stub->Register(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(s.error_message().find("serves job 'relay'"), std::string::npos)
        << s.error_message();
  }
  {  // the coordinator's own refusal comes back as it is
    grpc::ClientContext ctx;
    dynmo::v1::RegisterRequest req;
    req.set_job(kJob);
    req.set_pipeline_size(0);
    dynmo::v1::RegisterResponse resp;
    EXPECT_EQ(stub->Register(&ctx, req, &resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  {  // a session for a rank that never registered
    grpc::ClientContext ctx;
    auto stream = stub->Session(&ctx);
    dynmo::v1::AgentMessage hello;
    hello.mutable_hello()->set_job(kJob);
    hello.mutable_hello()->set_rank(3);
    stream->Write(hello);
    stream->WritesDone();
    dynmo::v1::CoordinatorMessage m;
    while (stream->Read(&m)) {
    }
    grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(s.error_message().find("must call Register"), std::string::npos)
        << s.error_message();
  }
  {  // a session that does not start with hello
    grpc::ClientContext ctx;
    auto stream = stub->Session(&ctx);
    dynmo::v1::AgentMessage report;
    report.mutable_report()->set_iteration(1);
    stream->Write(report);
    stream->WritesDone();
    dynmo::v1::CoordinatorMessage m;
    while (stream->Read(&m)) {
    }
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {  // relays do not nest: no host sessions through a relay
    grpc::ClientContext ctx;
    dynmo::v1::RegisterHostRequest req;
    dynmo::v1::RegisterHostResponse resp;
    EXPECT_EQ(stub->RegisterHost(&ctx, req, &resp).error_code(),
              grpc::StatusCode::UNIMPLEMENTED);
  }

  NodeRelayConfig bad;
  bad.coordinator = coord->address();
  bad.job = kJob;
  EXPECT_EQ(NodeRelay::Start(bad).status().code(), absl::StatusCode::kInvalidArgument)
      << "no listen address";
  bad.listen = dir.socket();
  bad.job = "";
  EXPECT_EQ(NodeRelay::Start(bad).status().code(), absl::StatusCode::kInvalidArgument)
      << "no job";
  bad.job = kJob;
  bad.listen = "unix:/nonexistent-dir/relay.sock";
  EXPECT_EQ(NodeRelay::Start(bad).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace dynmo::agent
