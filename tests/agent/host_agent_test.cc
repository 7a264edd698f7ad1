// HostAgent against an embedded coordinator over gRPC: multiplexed ranks
// and single-session ranks of one job apply the same plan at the same
// iteration; a host session that is lost reconnects and re-registers every
// rank it carries; bad host configurations are refused locally.
#include "agent/agent.h"
#include "agent/host_agent.h"

#include <algorithm>
#include <map>
#include <set>

#include "coordinator/service/embedded_coordinator.h"
#include "core/partition.h"
#include "gtest/gtest.h"
#include "tests/agent/test_coordinator.h"

namespace dynmo::agent {
namespace {

using service::EmbeddedCoordinator;

constexpr int kStages = 4;
constexpr int kReplicas = 3;  // 12 ranks: rank = replica * kStages + stage
constexpr int kRanks = kStages * kReplicas;
constexpr int kLayers = 12;


AgentConfig RankConfig(const std::string& address, int rank) {
  AgentConfig c;
  c.coordinator = address;
  c.job = "mux";
  c.rank = rank;
  c.pipeline_rank = rank % kStages;
  c.data_parallel_rank = rank / kStages;
  c.pipeline_size = kStages;
  c.data_parallel_size = kReplicas;
  c.num_layers = kLayers;
  c.host = "node" + std::to_string(rank / kStages);
  c.device = rank % kStages;
  c.initial_backoff = absl::Milliseconds(20);
  c.max_backoff = absl::Milliseconds(200);
  return c;
}

HostAgentConfig HostConfig(const std::string& address, int first, int count) {
  HostAgentConfig h;
  h.coordinator = address;
  for (int r = first; r < first + count; ++r) {
    h.ranks.push_back(RankConfig(address, r));
  }
  h.host = h.ranks[0].host;
  h.initial_backoff = absl::Milliseconds(20);
  h.max_backoff = absl::Milliseconds(200);
  return h;
}

// Layers 0..2 cost 5x the others: the uniform layout is unbalanced.
IterationSample Sample(int64_t iteration, const std::vector<int>& b, int stage) {
  IterationSample s;
  s.iteration = iteration;
  for (int l = b[static_cast<size_t>(stage)]; l < b[static_cast<size_t>(stage) + 1]; ++l) {
    core::LayerCost c;
    c.id = l;
    c.fwd_s = l < 3 ? 0.005 : 0.001;
    c.bwd_s = 2 * c.fwd_s;
    s.layers.push_back(c);
  }
  return s;
}

// Agent and HostedRank behind one interface for the simulated trainer loop.
struct AnyRank {
  Agent* agent = nullptr;
  HostedRank* hosted = nullptr;
  std::optional<wire::Plan> Due(int64_t k) {
    return agent ? agent->PlanToApplyAt(k) : hosted->PlanToApplyAt(k);
  }
  absl::Status Ack(uint64_t e, bool all) {
    return agent ? agent->Acknowledge(e, all) : hosted->Acknowledge(e, all);
  }
  absl::Status Report(const IterationSample& s) {
    return agent ? agent->ReportIteration(s) : hosted->ReportIteration(s);
  }
  AgentStats Stats() { return agent ? agent->stats() : hosted->stats(); }
};

// Runs the in-band-agreeing trainer loop until a plan is applied; returns
// epoch -> iterations at which ranks switched, and the final layout.
std::map<uint64_t, std::set<int64_t>> TrainUntilApplied(
    std::vector<AnyRank>& ranks, std::vector<int>* b) {
  std::map<uint64_t, std::set<int64_t>> applied_at;
  for (int64_t k = 0; k < 300 && applied_at.empty(); ++k) {
    std::vector<std::optional<wire::Plan>> due;
    for (auto& r : ranks) due.push_back(r.Due(k));
    bool all = true;
    for (auto& d : due) all = all && d && d->epoch == due[0]->epoch;
    for (size_t r = 0; r < ranks.size(); ++r) {
      if (!due[r]) continue;
      EXPECT_TRUE(ranks[r].Ack(due[r]->epoch, all).ok());
      if (all) applied_at[due[r]->epoch].insert(k);
    }
    if (all) b->assign(due[0]->boundaries.begin(), due[0]->boundaries.end());
    for (size_t r = 0; r < ranks.size(); ++r) {
      EXPECT_TRUE(ranks[r].Report(Sample(k, *b, static_cast<int>(r) % kStages)).ok());
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return applied_at;
}

class HostAgentMixedTest : public ::testing::TestWithParam<bool> {};

TEST_P(HostAgentMixedTest, MultiplexedAndSingleSessionRanksApplyTheSamePlanAtTheSameIteration) {
  auto coord = StartTestCoordinator("every:4", GetParam());
  ASSERT_NE(coord, nullptr);
  // Replicas 0 and 1 (ranks 0..7): two hosts of 4 multiplexed ranks each;
  // replica 2 (ranks 8..11): one ordinary Agent per rank.
  std::vector<std::unique_ptr<HostAgent>> hosts;
  std::vector<std::unique_ptr<Agent>> singles;
  std::vector<AnyRank> ranks;
  for (int h = 0; h < 2; ++h) {
    auto host = HostAgent::Start(HostConfig(coord->address(), h * kStages, kStages));
    ASSERT_TRUE(host.ok()) << host.status();
    hosts.push_back(*std::move(host));
    for (size_t i = 0; i < hosts.back()->size(); ++i) {
      ranks.push_back(AnyRank{nullptr, &hosts.back()->rank(i)});
    }
  }
  for (int r = 2 * kStages; r < kRanks; ++r) {
    auto a = Agent::Start(RankConfig(coord->address(), r));
    ASSERT_TRUE(a.ok()) << a.status();
    singles.push_back(*std::move(a));
    ranks.push_back(AnyRank{singles.back().get(), nullptr});
  }
  for (auto& h : hosts) ASSERT_TRUE(h->WaitConnected(absl::Seconds(10)));
  for (auto& a : singles) ASSERT_TRUE(a->WaitConnected(absl::Seconds(10)));

  std::vector<int> b = core::PartitionUniform(kLayers, kStages);
  auto applied_at = TrainUntilApplied(ranks, &b);
  ASSERT_EQ(applied_at.size(), 1u) << "no plan was applied";
  EXPECT_EQ(applied_at.begin()->second.size(), 1u)
      << "ranks switched at different iterations";
  const uint64_t epoch = applied_at.begin()->first;
  EXPECT_NE(b, core::PartitionUniform(kLayers, kStages));
  for (auto& r : ranks) {
    AgentStats st = r.Stats();
    EXPECT_EQ(st.applied_epoch, epoch);
    EXPECT_EQ(st.boundaries, b);
    EXPECT_EQ(st.plans_applied, 1);
    EXPECT_EQ(st.plans_failed, 0);
  }
  auto job = coord->server().coordinator().jobs().Find("mux");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ((*job)->Summary().connected_ranks(), kRanks)
      << "every rank held its session through the plan";
  for (int i = 0; i < 100 && (*job)->Summary().applied_epoch() != epoch; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ((*job)->Summary().applied_epoch(), epoch);
}

INSTANTIATE_TEST_SUITE_P(TwoPhaseAndInBand, HostAgentMixedTest,
                         ::testing::Values(false, true));

TEST(HostAgentTest, ALostHostSessionReconnectsAndReRegistersAllItsRanks) {
  auto first = StartTestCoordinator("every:4");
  ASSERT_NE(first, nullptr);
  const std::string address = first->address();
  auto host = HostAgent::Start(HostConfig(address, 0, kRanks));
  ASSERT_TRUE(host.ok()) << host.status();
  ASSERT_TRUE((*host)->WaitConnected(absl::Seconds(10)));
  std::vector<AnyRank> ranks;
  for (size_t i = 0; i < (*host)->size(); ++i) {
    ranks.push_back(AnyRank{nullptr, &(*host)->rank(i)});
  }
  std::vector<int> b = core::PartitionUniform(kLayers, kStages);
  auto applied_at = TrainUntilApplied(ranks, &b);
  ASSERT_EQ(applied_at.size(), 1u);
  const uint64_t epoch = applied_at.begin()->first;

  // The coordinator dies (no state dir): the stream is lost.
  first->Shutdown();
  first.reset();
  for (int i = 0; i < 200 && ranks[0].Stats().connected; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_FALSE(ranks[0].Stats().connected);
  auto second = StartTestCoordinator("manual", false, address);
  ASSERT_NE(second, nullptr);
  ASSERT_TRUE((*host)->WaitConnected(absl::Seconds(10)));
  for (auto& r : ranks) EXPECT_GE(r.Stats().connects, 2);

  // Every rank re-registered with its coordinates and applied epoch: the
  // new coordinator knows all of them and continues above their epoch.
  auto job = second->server().coordinator().jobs().Find("mux");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ((*job)->Record().ranks_size(), kRanks);
  // The agent is connected once its hello is written; the coordinator binds
  // the ranks when it has read it.
  for (int i = 0; i < 200 && (*job)->Summary().connected_ranks() < kRanks; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ((*job)->Summary().connected_ranks(), kRanks);
  EXPECT_EQ((*job)->Summary().epoch(), epoch);
  const dynmo::v1::JobStatus status = (*job)->Status();
  std::vector<int> job_b(status.boundaries().begin(), status.boundaries().end());
  EXPECT_EQ(job_b, b);
}

TEST(HostAgentTest, BadHostConfigurationsAreRefusedLocally) {
  HostAgentConfig none;
  none.coordinator = "127.0.0.1:1";
  EXPECT_EQ(HostAgent::Start(none).status().code(),
            absl::StatusCode::kInvalidArgument);
  HostAgentConfig twice = HostConfig("127.0.0.1:1", 0, 2);
  twice.ranks[1].rank = 0;
  EXPECT_EQ(HostAgent::Start(twice).status().code(),
            absl::StatusCode::kInvalidArgument);
  HostAgentConfig jobs = HostConfig("127.0.0.1:1", 0, 2);
  jobs.ranks[1].job = "other";
  EXPECT_EQ(HostAgent::Start(jobs).status().code(),
            absl::StatusCode::kInvalidArgument);
  HostAgentConfig coords = HostConfig("127.0.0.1:1", 0, 2);
  coords.ranks[1].pipeline_rank = kStages;
  EXPECT_EQ(HostAgent::Start(coords).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HostAgentTest, ARefusedRegistrationIsReportedAndRetried) {
  auto coord = StartTestCoordinator("manual");
  ASSERT_NE(coord, nullptr);
  // Rank 0 registered alone as stage 0 replica 0 ...
  auto a = Agent::Start(RankConfig(coord->address(), 0));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*a)->WaitConnected(absl::Seconds(10)));
  // ... so a host claiming those coordinates for rank 1 is refused whole.
  HostAgentConfig h = HostConfig(coord->address(), 1, 2);
  h.ranks[0].pipeline_rank = 0;
  h.ranks[0].data_parallel_rank = 0;
  auto host = HostAgent::Start(h);
  ASSERT_TRUE(host.ok());
  EXPECT_FALSE((*host)->WaitConnected(absl::Milliseconds(300)));
  EXPECT_NE((*host)->rank(1).stats().last_error.find("RegisterHost"),
            std::string::npos)
      << (*host)->rank(1).stats().last_error;
  auto job = coord->server().coordinator().jobs().Find("mux");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ((*job)->Record().ranks_size(), 1) << "rank 2 not registered either";
}

}  // namespace
}  // namespace dynmo::agent
