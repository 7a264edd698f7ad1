// Loopback integration: an embedded coordinator and 8 real agents over gRPC.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "agent/agent.h"
#include "coordinator/service/embedded_coordinator.h"
#include "core/partition.h"
#include "gtest/gtest.h"
#include "tests/agent/test_coordinator.h"

namespace dynmo::agent {
namespace {

using service::EmbeddedCoordinator;

constexpr int kRanks = 8;
constexpr int kLayers = 16;


AgentConfig Config(const std::string& address, int rank) {
  AgentConfig c;
  c.coordinator = address;
  c.job = "loop";
  c.rank = rank;
  c.pipeline_rank = rank;
  c.pipeline_size = kRanks;
  c.num_layers = kLayers;
  c.host = "node0";
  c.device = rank;
  c.initial_backoff = absl::Milliseconds(20);
  c.max_backoff = absl::Milliseconds(200);
  return c;
}

// A scripted imbalance: layers 0..3 cost 5x the others.
IterationSample Sample(int64_t iteration, const std::vector<int>& b,
                       const std::vector<int>& active, int stage) {
  IterationSample s;
  s.iteration = iteration;
  auto it = std::find(active.begin(), active.end(), stage);
  if (it == active.end()) return s;
  const size_t i = static_cast<size_t>(it - active.begin());
  for (int l = b[i]; l < b[i + 1]; ++l) {
    core::LayerCost c;
    c.id = l;
    c.fwd_s = l < 4 ? 0.005 : 0.001;
    c.bwd_s = 2 * c.fwd_s;
    c.resident_bytes = 1 << 20;
    s.layers.push_back(c);
  }
  return s;
}

class LoopbackCommitTest : public ::testing::TestWithParam<bool> {};

TEST_P(LoopbackCommitTest, EightAgentsApplyTheSamePlanAtTheSameIteration) {
  auto coord = StartTestCoordinator("every:4", GetParam());
  ASSERT_NE(coord, nullptr);
  std::vector<std::unique_ptr<Agent>> agents;
  for (int r = 0; r < kRanks; ++r) {
    auto a = Agent::Start(Config(coord->address(), r));
    ASSERT_TRUE(a.ok()) << a.status();
    agents.push_back(*std::move(a));
  }
  for (auto& a : agents) ASSERT_TRUE(a->WaitConnected(absl::Seconds(10)));

  std::vector<int> b = core::PartitionUniform(kLayers, kRanks);
  std::vector<int> active = {0, 1, 2, 3, 4, 5, 6, 7};
  std::map<uint64_t, std::set<int64_t>> applied_at;  // epoch -> iterations
  for (int64_t k = 0; k < 300 && applied_at.empty(); ++k) {
    std::vector<std::optional<wire::Plan>> due;
    for (auto& a : agents) due.push_back(a->PlanToApplyAt(k));
    bool all = true;
    for (auto& d : due) all = all && d && d->epoch == due[0]->epoch;
    for (int r = 0; r < kRanks; ++r) {
      if (due[r]) {
        ASSERT_TRUE(agents[r]->Acknowledge(due[r]->epoch, all).ok());
        if (all) applied_at[due[r]->epoch].insert(k);
      }
    }
    if (all) {
      b.assign(due[0]->boundaries.begin(), due[0]->boundaries.end());
    }
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_TRUE(agents[r]->ReportIteration(Sample(k, b, active, r)).ok());
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(applied_at.size(), 1u) << "no plan was applied";
  EXPECT_EQ(applied_at.begin()->second.size(), 1u)
      << "ranks switched at different iterations";
  const uint64_t epoch = applied_at.begin()->first;
  for (auto& a : agents) {
    EXPECT_EQ(a->stats().applied_epoch, epoch);
    EXPECT_EQ(a->stats().boundaries, b);
  }
  EXPECT_NE(b, core::PartitionUniform(kLayers, kRanks));
  // The coordinator settles the plan from the acks.
  auto job = coord->server().coordinator().jobs().Find("loop");
  ASSERT_TRUE(job.ok());
  for (int i = 0; i < 100 && (*job)->Summary().applied_epoch() != epoch; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ((*job)->Summary().applied_epoch(), epoch);
}

INSTANTIATE_TEST_SUITE_P(TwoPhaseAndInBand, LoopbackCommitTest,
                         ::testing::Values(false, true));

TEST(LoopbackTest, ReportingNeverBlocksAndDropsOldestWhenUnreachable) {
  AgentConfig c = Config("127.0.0.1:1", 0);  // nothing listens there
  c.queue_capacity = 4;
  auto a = Agent::Start(c);
  ASSERT_TRUE(a.ok());
  // Not blocking is shown by the counts, not a clock: the 100 calls return
  // while nothing is connected, and the queue kept only its capacity.
  for (int k = 0; k < 100; ++k) {
    IterationSample s;
    s.iteration = k;
    ASSERT_TRUE((*a)->ReportIteration(s).ok());
  }
  EXPECT_EQ((*a)->stats().samples_dropped, 96);
  EXPECT_FALSE((*a)->stats().connected);
  EXPECT_FALSE((*a)->PlanToApplyAt(5).has_value()) << "training goes on";
}

TEST(LoopbackTest, InvalidSamplesAreRejectedLocally) {
  auto a = Agent::Start(Config("127.0.0.1:1", 0));
  ASSERT_TRUE(a.ok());
  IterationSample s;
  core::LayerCost c;
  c.id = 0;
  c.fwd_s = std::nan("");
  s.layers.push_back(c);
  EXPECT_EQ((*a)->ReportIteration(s).code(), absl::StatusCode::kInvalidArgument);
  s.layers[0].fwd_s = 0;
  s.layers[0].id = kLayers;
  EXPECT_EQ((*a)->ReportIteration(s).code(), absl::StatusCode::kInvalidArgument);
  AgentConfig bad = Config("127.0.0.1:1", 0);
  bad.job = "";
  EXPECT_FALSE(Agent::Start(bad).ok());
}

TEST(LoopbackTest, AgentReconnectsAfterTheCoordinatorRestarts) {
  auto first = StartTestCoordinator("manual");
  ASSERT_NE(first, nullptr);
  const std::string address = first->address();
  auto a = Agent::Start(Config(address, 0));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*a)->WaitConnected(absl::Seconds(10)));
  first->Shutdown();
  first.reset();
  for (int i = 0; i < 200 && (*a)->stats().connected; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_FALSE((*a)->stats().connected);
  auto second = StartTestCoordinator("manual", false, address);
  ASSERT_NE(second, nullptr);
  ASSERT_TRUE((*a)->WaitConnected(absl::Seconds(10)));
  EXPECT_GE((*a)->stats().connects, 2);
  // The restarted coordinator knows the job again from the re-registration.
  EXPECT_TRUE(second->server().coordinator().jobs().Find("loop").ok());
}

TEST(EmbeddedCoordinatorTest, RefusesNonLoopbackAddresses) {
  service::ServerOptions o;
  o.listen = "0.0.0.0:0";
  EXPECT_EQ(EmbeddedCoordinator::Start(o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dynmo::agent
