// The agent's half of the plan protocol against a scripted fake coordinator:
// duplicates are re-acknowledged and never applied twice, stale epochs are
// ignored, an uncommitted plan is failed at its apply iteration.
#include <deque>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "agent/agent.h"
#include "dynmo/v1/agent.grpc.pb.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"

namespace dynmo::agent {
namespace {

using dynmo::v1::AgentMessage;
using dynmo::v1::CoordinatorMessage;
using dynmo::v1::PlanAck;

// Sends whatever the test queues to the session; records every ack.
class FakeCoordinator final : public dynmo::v1::AgentService::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const dynmo::v1::RegisterRequest*,
                        dynmo::v1::RegisterResponse*) override {
    absl::MutexLock lock(&mu_);
    ++registers_;
    return grpc::Status::OK;
  }

  grpc::Status Session(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<CoordinatorMessage, AgentMessage>* stream)
      override {
    AgentMessage in;
    if (!stream->Read(&in) || !in.has_hello()) {
      return grpc::Status(grpc::INVALID_ARGUMENT, "no hello");
    }
    std::thread reader([&] {
      AgentMessage m;
      while (stream->Read(&m)) {
        absl::MutexLock lock(&mu_);
        if (m.has_ack()) acks_.push_back(m.ack());
        if (m.has_report()) ++reports_;
      }
    });
    while (!ctx->IsCancelled()) {
      std::optional<CoordinatorMessage> next;
      {
        absl::MutexLock lock(&mu_);
        mu_.AwaitWithTimeout(absl::Condition(this, &FakeCoordinator::HasOut),
                             absl::Milliseconds(50));
        if (!out_.empty()) {
          next = out_.front();
          out_.pop_front();
        }
      }
      if (next && !stream->Write(*next)) break;
    }
    reader.join();
    return grpc::Status::OK;
  }

  void Push(const CoordinatorMessage& m) {
    absl::MutexLock lock(&mu_);
    out_.push_back(m);
  }
  // Waits until `n` acks arrived; returns them.
  std::vector<PlanAck> Acks(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return acks_.size() >= n;
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return acks_;
  }

 private:
  bool HasOut() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !out_.empty(); }
  absl::Mutex mu_;
  std::deque<CoordinatorMessage> out_ ABSL_GUARDED_BY(mu_);
  std::vector<PlanAck> acks_ ABSL_GUARDED_BY(mu_);
  int registers_ ABSL_GUARDED_BY(mu_) = 0;
  int reports_ ABSL_GUARDED_BY(mu_) = 0;
};

CoordinatorMessage Prepare(uint64_t epoch, int64_t apply) {
  CoordinatorMessage m;
  m.mutable_prepare()->set_epoch(epoch);
  m.mutable_prepare()->set_apply_iteration(apply);
  for (int b : {0, 3, 8}) m.mutable_prepare()->add_boundaries(b);
  for (int s : {0, 1}) m.mutable_prepare()->add_active_stages(s);
  return m;
}

CoordinatorMessage Commit(uint64_t epoch) {
  CoordinatorMessage m;
  m.mutable_commit()->set_epoch(epoch);
  return m;
}

class AgentProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(&fake_);
    server_ = b.BuildAndStart();
    AgentConfig c;
    c.coordinator = "127.0.0.1:" + std::to_string(port_);
    c.job = "job";
    c.pipeline_size = 2;
    c.num_layers = 8;
    auto a = Agent::Start(c);
    ASSERT_TRUE(a.ok());
    agent_ = *std::move(a);
    ASSERT_TRUE(agent_->WaitConnected(absl::Seconds(10)));
  }
  void TearDown() override {
    agent_->Stop();
    server_->Shutdown(std::chrono::system_clock::now());
  }
  void RunTo(int64_t iteration) {
    IterationSample s;
    s.iteration = iteration;
    ASSERT_TRUE(agent_->ReportIteration(s).ok());
  }

  FakeCoordinator fake_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Agent> agent_;
};

TEST_F(AgentProtocolTest, DuplicatesAreReackedAndAppliedOnce) {
  fake_.Push(Prepare(2, 10));
  fake_.Push(Prepare(2, 10));  // duplicate
  fake_.Push(Prepare(1, 10));  // stale: older than the pending plan
  fake_.Push(Commit(2));
  fake_.Push(Commit(2));       // duplicate
  auto acks = fake_.Acks(2);
  ASSERT_GE(acks.size(), 2u);
  EXPECT_EQ(acks[0].state(), PlanAck::PREPARED);
  EXPECT_EQ(acks[1].state(), PlanAck::PREPARED);
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(fake_.Acks(0).size(), 2u) << "the stale epoch got an answer";
  EXPECT_FALSE(agent_->PlanToApplyAt(9).has_value());
  auto plan = agent_->PlanToApplyAt(10);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->epoch, 2u);
  ASSERT_TRUE(agent_->Acknowledge(2, true).ok());
  EXPECT_EQ(agent_->stats().applied_epoch, 2u);
  EXPECT_EQ(agent_->stats().boundaries, (std::vector<int>{0, 3, 8}));
  // The same plan again (a lost ack made the coordinator resend it).
  fake_.Push(Prepare(2, 10));
  fake_.Push(Commit(2));
  acks = fake_.Acks(4);
  ASSERT_EQ(acks.size(), 4u);
  EXPECT_EQ(acks[2].state(), PlanAck::APPLIED);
  EXPECT_EQ(acks[3].state(), PlanAck::APPLIED) << "re-acked, not re-applied";
  EXPECT_EQ(agent_->stats().plans_applied, 1);
  EXPECT_FALSE(agent_->Acknowledge(2, true).ok());
  EXPECT_EQ(agent_->LatestCommittedPlan()->epoch, 2u);
}

TEST_F(AgentProtocolTest, UncommittedPlanIsFailedAtItsApplyIteration) {
  fake_.Push(Prepare(1, 5));
  ASSERT_EQ(fake_.Acks(1)[0].state(), PlanAck::PREPARED);
  EXPECT_FALSE(agent_->PlanToApplyAt(5).has_value());
  auto acks = fake_.Acks(2);
  ASSERT_EQ(acks.size(), 2u);
  EXPECT_EQ(acks[1].state(), PlanAck::FAILED);
  EXPECT_EQ(agent_->stats().applied_epoch, 0u);
  // A COMMIT that arrives after the fact changes nothing.
  fake_.Push(Commit(1));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(agent_->LatestCommittedPlan().has_value());
}

TEST_F(AgentProtocolTest, PlanWhoseApplyIterationPassedIsRefused) {
  RunTo(7);
  fake_.Push(Prepare(1, 5));
  auto acks = fake_.Acks(1);
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].state(), PlanAck::FAILED);
}

TEST_F(AgentProtocolTest, OnePhasePlanIsCommittedByItsPrepare) {
  CoordinatorMessage m = Prepare(4, 20);
  m.mutable_prepare()->set_commit_with_prepare(true);
  fake_.Push(m);
  ASSERT_EQ(fake_.Acks(1)[0].state(), PlanAck::PREPARED);
  auto plan = agent_->PlanToApplyAt(20);
  ASSERT_TRUE(plan.has_value());
  ASSERT_TRUE(agent_->Acknowledge(4, true).ok());
  EXPECT_EQ(agent_->stats().applied_epoch, 4u);
}

TEST_F(AgentProtocolTest, AbortDropsThePendingPlan) {
  fake_.Push(Prepare(3, 50));
  fake_.Acks(1);
  CoordinatorMessage abort;
  abort.mutable_abort()->set_epoch(3);
  fake_.Push(abort);
  fake_.Push(Commit(3));  // a commit can never follow an abort; ignored
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(agent_->PlanToApplyAt(50).has_value());
  EXPECT_EQ(agent_->stats().plans_failed, 1);
}

}  // namespace
}  // namespace dynmo::agent
