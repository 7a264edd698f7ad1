// JobState with multiplexed sessions: one SessionSink shared by several
// ranks receives each plan message once, addressed to its ranks, next to
// one-rank sinks of the same job; attaching is all or nothing.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "coordinator/service/job_state.h"
#include "gtest/gtest.h"

namespace dynmo::service {
namespace {

using dynmo::v1::CoordinatorMessage;
using dynmo::v1::PlanAck;

// Records (ranks, message) per SendTo; host() marks it multiplexed.
class HostSink : public SessionSink {
 public:
  explicit HostSink(std::string host) : host_(std::move(host)) {}
  void SendTo(absl::Span<const int> ranks,
              std::shared_ptr<const CoordinatorMessage> m) override {
    absl::MutexLock lock(&mu_);
    sent_.push_back({std::vector<int>(ranks.begin(), ranks.end()), *m});
  }
  void Close(const absl::Status& s) override {
    absl::MutexLock lock(&mu_);
    closed_ = s;
  }
  const std::string& host() const override { return host_; }
  std::vector<std::pair<std::vector<int>, CoordinatorMessage>> Take() {
    absl::MutexLock lock(&mu_);
    std::vector<std::pair<std::vector<int>, CoordinatorMessage>> out;
    out.swap(sent_);
    return out;
  }
  absl::Status closed() {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  const std::string host_;
  absl::Mutex mu_;
  std::vector<std::pair<std::vector<int>, CoordinatorMessage>> sent_;
  absl::Status closed_;
};

constexpr int kStages = 4;
constexpr int kReplicas = 2;
constexpr int kRanks = kStages * kReplicas;
constexpr int kLayers = 8;

dynmo::v1::RegisterRequest Reg(int rank) {
  dynmo::v1::RegisterRequest r;
  r.set_job("job");
  r.set_rank(rank);
  r.set_pipeline_rank(rank % kStages);
  r.set_data_parallel_rank(rank / kStages);
  r.set_pipeline_size(kStages);
  r.set_data_parallel_size(kReplicas);
  r.set_num_layers(kLayers);
  return r;
}

// Layers 0 and 1 are 4x heavier: the uniform layout is unbalanced.
dynmo::v1::IterationReport Report(int rank, int64_t iteration) {
  dynmo::v1::IterationReport rep;
  rep.set_iteration(iteration);
  const int stage = rank % kStages;
  for (int l = 2 * stage; l < 2 * stage + 2; ++l) {
    auto* s = rep.add_layers();
    s->set_layer(l);
    const double t = l < 2 ? 0.04 : 0.01;
    s->set_fwd_s(t);
    s->set_bwd_s(t);
    s->set_wgrad_s(t);
  }
  return rep;
}

class JobStateHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dynmo_jobhost_XXXXXX";
    dir_ = mkdtemp(tmpl);
    keeper_ = std::make_unique<StateKeeper>(dir_);
    ASSERT_TRUE(keeper_->Open().ok());
    pool_ = std::make_unique<ReleasedPool>(keeper_.get());
    JobOptions options;
    options.default_policy.trigger.kind = Trigger::Kind::kManual;
    options.plan_lead_iterations = 5;
    job_ = std::make_unique<JobState>(
        Reg(0), options, JobDeps{keeper_.get(), pool_.get(), nullptr});
    google::protobuf::RepeatedPtrField<dynmo::v1::RegisterRequest> all;
    for (int r = 0; r < kRanks; ++r) *all.Add() = Reg(r);
    std::vector<dynmo::v1::RegisterResponse> responses;
    ASSERT_TRUE(job_->RegisterMany(all, &responses).ok());
    ASSERT_EQ(responses.size(), static_cast<size_t>(kRanks));
    for (const auto& r : responses) keys_.push_back(r.session_key());
  }

  // The session keys of `ranks`, in their order (a rank outside the job
  // gets a made-up one).
  std::vector<std::string> Keys(const std::vector<int>& ranks) const {
    std::vector<std::string> out;
    for (int r : ranks) out.push_back(r >= 0 && r < kRanks ? keys_[r] : "none");
    return out;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
  std::unique_ptr<StateKeeper> keeper_;
  std::unique_ptr<ReleasedPool> pool_;
  std::unique_ptr<JobState> job_;
  std::vector<std::string> keys_;  // each rank's session key
};

TEST_F(JobStateHostTest, APlanReachesAHostSessionOnceForAllItsRanksBesideSingleSessions) {
  // Replica 0 (ranks 0..3) on one host session, replica 1 one sink per rank.
  auto host = std::make_shared<HostSink>("node0");
  const std::vector<int> hosted = {0, 1, 2, 3};
  ASSERT_TRUE(job_->AttachHost(hosted, Keys(hosted), host).ok());
  std::vector<std::shared_ptr<HostSink>> singles;
  for (int r = 4; r < kRanks; ++r) {
    singles.push_back(std::make_shared<HostSink>(""));
    ASSERT_TRUE(job_->Attach(r, keys_[r], singles.back()).ok());
  }
  for (int r = 0; r < kRanks; ++r) ASSERT_TRUE(job_->OnReport(r, Report(r, 1)).ok());
  auto issued = job_->Rebalance(absl::Now());
  ASSERT_TRUE(issued.ok()) << issued.status();
  ASSERT_TRUE(issued->issued());
  const uint64_t epoch = issued->plan().epoch();

  auto sent = host->Take();
  ASSERT_EQ(sent.size(), 1u) << "one PREPARE for the whole host";
  EXPECT_EQ(sent[0].first, hosted);
  EXPECT_EQ(sent[0].second.prepare().epoch(), epoch);
  for (auto& s : singles) {
    auto one = s->Take();
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(one[0].second.prepare().SerializeAsString(),
              sent[0].second.prepare().SerializeAsString())
        << "the same plan for hosted and single ranks";
  }

  // Every rank prepares (hosted ranks in one batch): one COMMIT per sink.
  dynmo::v1::HostBatch batch;
  for (int r : hosted) {
    auto* m = batch.add_messages();
    m->set_rank(r);
    m->mutable_ack()->set_epoch(epoch);
    m->mutable_ack()->set_state(PlanAck::PREPARED);
  }
  ASSERT_TRUE(job_->OnHostBatch(batch).ok());
  EXPECT_TRUE(host->Take().empty()) << "not committed before every rank";
  for (int r = 4; r < kRanks; ++r) {
    PlanAck a;
    a.set_epoch(epoch);
    a.set_state(PlanAck::PREPARED);
    ASSERT_TRUE(job_->OnAck(r, a).ok());
  }
  sent = host->Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].first, hosted);
  EXPECT_EQ(sent[0].second.commit().epoch(), epoch);
  EXPECT_EQ(job_->Summary().plan_state(), "committed");
}

TEST_F(JobStateHostTest, AttachHostIsAllOrNothing) {
  auto node0 = std::make_shared<HostSink>("node0");
  ASSERT_TRUE(job_->AttachHost({0, 1}, Keys({0, 1}), node0).ok());
  auto node1 = std::make_shared<HostSink>("node1");
  EXPECT_EQ(job_->AttachHost({2, 1}, Keys({2, 1}), node1).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(job_->AttachHost({2, kRanks}, Keys({2, kRanks}), node1).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(job_->Summary().connected_ranks(), 2) << "rank 2 was not bound";
  EXPECT_TRUE(node0->closed().ok()) << "node0 was not disturbed";
  // A newer session of node0 takes its ranks over and closes the old one.
  auto node0b = std::make_shared<HostSink>("node0");
  ASSERT_TRUE(job_->AttachHost({0, 1, 2}, Keys({0, 1, 2}), node0b).ok());
  EXPECT_EQ(node0->closed().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(job_->Summary().connected_ranks(), 3);
  job_->DetachHost(std::vector<int>{0, 1}, node0.get());  // stale: no-op
  EXPECT_EQ(job_->Summary().connected_ranks(), 3);
  job_->DetachHost(std::vector<int>{0, 1, 2}, node0b.get());
  EXPECT_EQ(job_->Summary().connected_ranks(), 0);
}

TEST_F(JobStateHostTest, AReattachedHostGetsTheInFlightPlanOnceForItsRanks) {
  std::vector<std::shared_ptr<HostSink>> sinks;
  for (int h = 0; h < 2; ++h) {
    sinks.push_back(std::make_shared<HostSink>("node" + std::to_string(h)));
    std::vector<int> ranks;
    for (int r = h * 4; r < h * 4 + 4; ++r) ranks.push_back(r);
    ASSERT_TRUE(job_->AttachHost(ranks, Keys(ranks), sinks.back()).ok());
  }
  for (int r = 0; r < kRanks; ++r) ASSERT_TRUE(job_->OnReport(r, Report(r, 1)).ok());
  auto issued = job_->Rebalance(absl::Now());
  ASSERT_TRUE(issued.ok() && issued->issued());
  // node1 lost its stream and comes back: PREPARE re-sent, once.
  auto again = std::make_shared<HostSink>("node1");
  ASSERT_TRUE(job_->AttachHost({4, 5, 6, 7}, Keys({4, 5, 6, 7}), again).ok());
  auto sent = again->Take();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].first, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(sent[0].second.prepare().epoch(), issued->plan().epoch());
}

}  // namespace
}  // namespace dynmo::service
