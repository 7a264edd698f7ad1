// Re-shaping through the job state: with policy elastic = reshape a job of
// 4 x 1 ranks whose model now fits two stages becomes 2 x 2 on the same
// ranks — the plan says so (plan.proto's Reshape), nothing is released,
// and once applied the roster, layout, summary and durable record hold the
// new grid; a rank re-registers with its new coordinates. With elastic =
// release the same job releases stages instead.
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "coordinator/service/job_state.h"
#include "gtest/gtest.h"
#include "tests/service/state_dir_fixture.h"

namespace dynmo::service {
namespace {

using dynmo::v1::CoordinatorMessage;
using dynmo::v1::PlanAck;

class NullSink : public SessionSink {
 public:
  void SendTo(absl::Span<const int> /*ranks*/, std::shared_ptr<const CoordinatorMessage>) override {}
  void Close(const absl::Status&) override {}
};

constexpr int kRanks = 4;
constexpr int kLayers = 8;
constexpr int64_t kLayerBytes = 1 << 20;

dynmo::v1::RegisterRequest Reg(int rank, int pp, int dp) {
  dynmo::v1::RegisterRequest r;
  r.set_job("job");
  r.set_rank(rank);
  r.set_pipeline_rank(rank / dp);
  r.set_data_parallel_rank(rank % dp);
  r.set_pipeline_size(pp);
  r.set_data_parallel_size(dp);
  r.set_num_layers(kLayers);
  r.set_microbatches(8 / dp);
  r.set_host("host");
  r.set_device(rank);
  // Four layers fit a device, eight do not: 2 x 2 is the shortest pipeline.
  r.set_memory_capacity_bytes(5 * kLayerBytes);
  return r;
}

// Every layer equal: 4 x 1 runs (8 + 3) x 2 layer-times per iteration,
// 2 x 2 runs (4 + 1) x 4, which the cost model prefers by 10%.
dynmo::v1::IterationReport Report(int stage, int64_t iteration) {
  dynmo::v1::IterationReport rep;
  rep.set_iteration(iteration);
  for (int l = 2 * stage; l < 2 * stage + 2; ++l) {
    auto* s = rep.add_layers();
    s->set_layer(l);
    s->set_fwd_s(0.01);
    s->set_bwd_s(0.01);
    s->set_wgrad_s(0.01);
    s->set_params(1000);
    s->set_resident_bytes(kLayerBytes);
  }
  return rep;
}

PlanAck Ack(uint64_t epoch, PlanAck::State state) {
  PlanAck a;
  a.set_epoch(epoch);
  a.set_state(state);
  return a;
}

class ReshapeTest : public StateDirTest {
 protected:
  void Start(Elastic elastic) {
    options_.default_policy.trigger.kind = Trigger::Kind::kManual;
    options_.default_policy.repack = true;
    options_.default_policy.repack_tolerance = 1.0;
    options_.default_policy.elastic = elastic;
    job_ = std::make_unique<JobState>(Reg(0, kRanks, 1), options_,
                                      JobDeps{keeper_.get(), pool_.get(), nullptr});
    for (int r = 0; r < kRanks; ++r) {
      dynmo::v1::RegisterResponse resp;
      ASSERT_TRUE(job_->Register(Reg(r, kRanks, 1), &resp).ok());
      ASSERT_TRUE(job_->Attach(r, resp.session_key(), std::make_shared<NullSink>()).ok());
    }
    for (int r = 0; r < kRanks; ++r) ASSERT_TRUE(job_->OnReport(r, Report(r, 0)).ok());
  }
  JobOptions options_;
  std::unique_ptr<JobState> job_;
};

TEST_F(ReshapeTest, TheJobBecomesTwoByTwoOnTheSameRanks) {
  Start(Elastic::kReshape);
  auto reb = job_->Rebalance(absl::Now());
  ASSERT_TRUE(reb.ok()) << reb.status();
  ASSERT_TRUE(reb->issued()) << reb->detail();
  const dynmo::v1::Plan& plan = reb->plan();
  EXPECT_EQ(plan.reason(), "operator+reshape");
  ASSERT_TRUE(plan.has_reshape());
  EXPECT_EQ(plan.reshape().pipeline_size(), 2);
  EXPECT_EQ(plan.reshape().data_parallel_size(), 2);
  EXPECT_EQ(std::vector<int>(plan.boundaries().begin(), plan.boundaries().end()),
            (std::vector<int>{0, 4, 8}));
  EXPECT_EQ(std::vector<int>(plan.active_stages().begin(), plan.active_stages().end()),
            (std::vector<int>{0, 1}));
  EXPECT_EQ(plan.released_stages_size(), 0);
  EXPECT_EQ(plan.migrations_size(), 0);
  EXPECT_EQ(plan.split_size(), 0);
  // Each position receives the other pair of its new stage: 2 layers.
  EXPECT_EQ(plan.reshape().copy_bytes(), kRanks * 2 * kLayerBytes);
  EXPECT_GT(plan.reshape().predicted_microbatches_per_s(),
            plan.reshape().previous_microbatches_per_s() * 1.01);

  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(job_->OnAck(r, Ack(plan.epoch(), PlanAck::PREPARED)).ok());
  }
  ASSERT_TRUE(job_->OnAck(0, Ack(plan.epoch(), PlanAck::APPLIED)).ok());
  const dynmo::v1::JobSummary s = job_->Summary();
  EXPECT_EQ(s.pipeline_size(), 2);
  EXPECT_EQ(s.data_parallel_size(), 2);
  EXPECT_EQ(s.active_stages(), 2);
  EXPECT_EQ(s.released_stages(), 0);
  EXPECT_TRUE(pool_->List("job", false).empty());
  // The scheduler sees the same GPUs in new places.
  const std::vector<dynmo::v1::GpuPlacement> where = job_->Placements();
  ASSERT_EQ(where.size(), static_cast<size_t>(kRanks));
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(where[r].device(), r);
    EXPECT_FALSE(where[r].released());
    EXPECT_EQ(where[r].stage(), r / 2);
    EXPECT_EQ(where[r].replica(), r % 2);
    EXPECT_EQ(where[r].epoch(), plan.epoch());
  }

  // Rank 1 is now stage 0, replica 1; its old coordinates are refused.
  dynmo::v1::RegisterResponse resp;
  EXPECT_FALSE(job_->Register(Reg(1, kRanks, 1), &resp).ok());
  EXPECT_TRUE(job_->Register(Reg(1, 2, 2), &resp).ok());

  // The durable record holds the new grid.
  StateKeeper keeper(dir_);
  auto state = keeper.Open();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->jobs_size(), 1);
  EXPECT_EQ(state->jobs(0).pipeline_size(), 2);
  EXPECT_EQ(state->jobs(0).data_parallel_size(), 2);
  ReleasedPool pool(&keeper);
  JobState restored(state->jobs(0), options_, JobDeps{&keeper, &pool, nullptr});
  EXPECT_EQ(restored.Summary().pipeline_size(), 2);
  EXPECT_EQ(restored.Summary().data_parallel_size(), 2);
  EXPECT_TRUE(restored.Register(Reg(3, 2, 2), &resp).ok());
}

TEST_F(ReshapeTest, ReleaseModeHandsTheStagesBackInstead) {
  Start(Elastic::kRelease);
  auto reb = job_->Rebalance(absl::Now());
  ASSERT_TRUE(reb.ok()) << reb.status();
  ASSERT_TRUE(reb->issued()) << reb->detail();
  const dynmo::v1::Plan& plan = reb->plan();
  EXPECT_FALSE(plan.has_reshape());
  ASSERT_GT(plan.released_stages_size(), 0);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(job_->OnAck(r, Ack(plan.epoch(), PlanAck::PREPARED)).ok());
  }
  ASSERT_TRUE(job_->OnAck(0, Ack(plan.epoch(), PlanAck::APPLIED)).ok());
  int released = 0;
  for (const auto& p : job_->Placements()) {
    if (p.released()) {
      ++released;
      EXPECT_EQ(p.stage(), -1);
    }
  }
  EXPECT_EQ(released, plan.released_stages_size());
}

TEST_F(ReshapeTest, ReshapeModeWithoutAFasterGridOnlyReBalances) {
  // A device that holds only two layers: 4 x 1 is the only grid that fits.
  JobOptions options;
  options.default_policy.trigger.kind = Trigger::Kind::kManual;
  options.default_policy.repack = true;
  options.default_policy.elastic = Elastic::kReshape;
  auto small = [](int r) {
    dynmo::v1::RegisterRequest q = Reg(r, kRanks, 1);
    q.set_memory_capacity_bytes(2 * kLayerBytes + kLayerBytes / 2);
    return q;
  };
  JobState job(small(0), options, JobDeps{keeper_.get(), pool_.get(), nullptr});
  for (int r = 0; r < kRanks; ++r) {
    dynmo::v1::RegisterResponse resp;
    ASSERT_TRUE(job.Register(small(r), &resp).ok());
    ASSERT_TRUE(job.Attach(r, resp.session_key(), std::make_shared<NullSink>()).ok());
  }
  for (int r = 0; r < kRanks; ++r) ASSERT_TRUE(job.OnReport(r, Report(r, 0)).ok());
  auto reb = job.Rebalance(absl::Now());
  ASSERT_TRUE(reb.ok()) << reb.status();
  EXPECT_FALSE(reb->issued());  // uniform is optimal; nothing released
  EXPECT_EQ(job.Summary().pipeline_size(), kRanks);
}

}  // namespace
}  // namespace dynmo::service
