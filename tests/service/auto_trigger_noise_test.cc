// The auto trigger on noisy timings: a stationary job must not flip between
// layouts (no A -> B -> A within 10 plans), and a real shift of load must
// still be followed. Drives one JobState through the whole plan protocol
// (PREPARE, PREPARED from every rank, reports under the new epoch) with a
// synthetic, seeded trace: deterministic.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "coordinator/service/job_state.h"
#include "gtest/gtest.h"

namespace dynmo::service {
namespace {

using dynmo::v1::CoordinatorMessage;
using dynmo::v1::PlanAck;

constexpr int kStages = 4;
constexpr int kLayers = 8;

class Outbox : public SessionSink {
 public:
  void SendTo(absl::Span<const int> /*ranks*/, std::shared_ptr<const CoordinatorMessage> m) override {
    absl::MutexLock lock(&mu_);
    sent_.push_back(*m);
  }
  void Close(const absl::Status&) override {}
  std::vector<CoordinatorMessage> Take() {
    absl::MutexLock lock(&mu_);
    std::vector<CoordinatorMessage> out;
    out.swap(sent_);
    return out;
  }

 private:
  absl::Mutex mu_;
  std::vector<CoordinatorMessage> sent_;
};

dynmo::v1::RegisterRequest Reg(int rank) {
  dynmo::v1::RegisterRequest r;
  r.set_job("noisy");
  r.set_rank(rank);
  r.set_pipeline_rank(rank);
  r.set_pipeline_size(kStages);
  r.set_data_parallel_size(1);
  r.set_num_layers(kLayers);
  r.set_host("host");
  r.set_device(rank);
  r.set_memory_capacity_bytes(1LL << 34);
  // A pipeline's micro-batches: the auto gate prices the step time of the
  // schedule, which one micro-batch would leave no re-balance to gain.
  r.set_microbatches(8);
  return r;
}

// One simulated job: true per-layer costs, multiplicative timing noise
// (normal, relative sd `noise`, plus a 2x outlier in 1% of the samples, as a
// descheduled thread gives), and the layout the "trainer" runs.
class NoisyJob {
 public:
  NoisyJob(double noise_sigmas, double noise, uint32_t seed)
      : noise_(noise), rng_(seed) {
    dir_ = std::filesystem::temp_directory_path() /
           ("dynmo_noise_" + std::to_string(seed) + "_" +
            std::to_string(static_cast<int>(noise_sigmas * 10)));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    keeper_ = std::make_unique<StateKeeper>(dir_.string());
    EXPECT_TRUE(keeper_->Open().ok());
    pool_ = std::make_unique<ReleasedPool>(keeper_.get());
    JobOptions options;
    options.default_policy.trigger.kind = Trigger::Kind::kAuto;
    options.default_policy.balancer = core::PartitionMethod::kOptimal;
    options.plan_lead_iterations = 5;
    options.auto_options.noise_sigmas = noise_sigmas;
    job_ = std::make_unique<JobState>(Reg(0), options,
                                      JobDeps{keeper_.get(), pool_.get(), nullptr});
    for (int r = 0; r < kStages; ++r) {
      dynmo::v1::RegisterResponse resp;
      EXPECT_TRUE(job_->Register(Reg(r), &resp).ok());
      sinks_.push_back(std::make_shared<Outbox>());
      EXPECT_TRUE(job_->Attach(r, resp.session_key(), sinks_.back()).ok());
    }
    layouts_.push_back(boundaries_);
  }
  ~NoisyJob() { std::filesystem::remove_all(dir_); }

  std::vector<double> cost = {1.0, 1.0, 1.2, 0.8, 1.0, 1.1, 0.9, 1.0};  // x 10 ms

  // Runs iterations [from, to): switch to a committed plan at its apply
  // iteration, report every stage's layers, tick, and prepare what arrives.
  void Run(int64_t from, int64_t to) {
    std::normal_distribution<double> normal(0.0, noise_);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    for (int64_t it = from; it < to; ++it) {
      if (pending_ && it >= pending_apply_) {
        boundaries_ = pending_boundaries_;
        epoch_ = pending_epoch_;
        pending_ = false;
        layouts_.push_back(boundaries_);
      }
      for (int r = 0; r < kStages; ++r) {
        dynmo::v1::IterationReport rep;
        rep.set_iteration(it);
        rep.set_applied_epoch(epoch_);
        for (int l = boundaries_[r]; l < boundaries_[r + 1]; ++l) {
          double factor = std::max(0.2, 1 + normal(rng_));
          if (uniform(rng_) < 0.01) factor *= 2;
          const double t = 0.01 * cost[static_cast<size_t>(l)] * factor;
          auto* s = rep.add_layers();
          s->set_layer(l);
          s->set_fwd_s(t / 3);
          s->set_bwd_s(2 * t / 3);
          s->set_resident_bytes(64 << 20);
        }
        ASSERT_TRUE(job_->OnReport(r, rep).ok());
      }
      job_->Tick(absl::Now());
      for (auto& sink : sinks_) {
        for (const CoordinatorMessage& m : sink->Take()) {
          if (!m.has_prepare() || sink != sinks_[0]) continue;
          pending_ = true;
          pending_epoch_ = m.prepare().epoch();
          pending_apply_ = m.prepare().apply_iteration();
          pending_boundaries_.assign(m.prepare().boundaries().begin(),
                                     m.prepare().boundaries().end());
          for (int r = 0; r < kStages; ++r) {
            PlanAck a;
            a.set_epoch(pending_epoch_);
            a.set_state(PlanAck::PREPARED);
            a.set_iteration(it);
            ASSERT_TRUE(job_->OnAck(r, a).ok());
          }
        }
      }
    }
  }

  // Layouts the job ran, the initial one first.
  const std::vector<std::vector<int>>& layouts() const { return layouts_; }

 private:
  double noise_;
  std::mt19937 rng_;
  std::filesystem::path dir_;
  std::unique_ptr<StateKeeper> keeper_;
  std::unique_ptr<ReleasedPool> pool_;
  std::unique_ptr<JobState> job_;
  std::vector<std::shared_ptr<Outbox>> sinks_;
  std::vector<int> boundaries_ = {0, 2, 4, 6, 8};
  uint64_t epoch_ = 0;
  bool pending_ = false;
  uint64_t pending_epoch_ = 0;
  int64_t pending_apply_ = 0;
  std::vector<int> pending_boundaries_;
  std::vector<std::vector<int>> layouts_;
};

// The first pair (i, j), j - i <= 10 plans, i < j - 1, with the same layout.
std::string FirstReturn(const std::vector<std::vector<int>>& layouts) {
  for (size_t i = 0; i < layouts.size(); ++i) {
    for (size_t j = i + 2; j < layouts.size() && j <= i + 10; ++j) {
      if (layouts[i] == layouts[j]) {
        return "layout " + std::to_string(i) + " came back as layout " +
               std::to_string(j);
      }
    }
  }
  return "";
}

TEST(AutoTriggerNoiseTest, StationaryNoisyLoadNeverFlipsBack) {
  // Relative sample noise of 15% (a quiet machine) to 50% (ranks sharing
  // cores); 2,000 iterations each.
  for (double noise : {0.15, 0.3, 0.5}) {
    for (uint32_t seed : {1u, 2u, 3u}) {
      NoisyJob job(/*noise_sigmas=*/3.0, noise, seed);
      job.Run(0, 2000);
      EXPECT_EQ(FirstReturn(job.layouts()), "") << "noise " << noise << " seed " << seed;
      EXPECT_LE(job.layouts().size(), 3u)
          << "noise " << noise << " seed " << seed << ": a stationary load got "
          << job.layouts().size() - 1 << " plans";
    }
  }
}

TEST(AutoTriggerNoiseTest, WithoutTheNoiseTestTheSameTraceFlipsBack) {
  // The control: payback, 5% minimum gain, confirmations and cool-down alone
  // chase the same noise (about 20 plans in 2,000 iterations at 50% noise,
  // each returning to an earlier layout): the test above tests something.
  for (uint32_t seed : {1u, 2u, 3u}) {
    NoisyJob job(/*noise_sigmas=*/0.0, /*noise=*/0.5, seed);
    job.Run(0, 2000);
    EXPECT_NE(FirstReturn(job.layouts()), "") << "seed " << seed;
  }
}

TEST(AutoTriggerNoiseTest, ARealShiftIsStillFollowed) {
  NoisyJob job(/*noise_sigmas=*/3.0, /*noise=*/0.3, 7);
  job.Run(0, 300);
  const size_t before = job.layouts().size();
  job.cost[6] = job.cost[7] = 2.5;  // the last stage's layers get 2.5x heavier
  job.Run(300, 600);
  ASSERT_GT(job.layouts().size(), before) << "the shift was not followed";
  const std::vector<int>& last = job.layouts().back();
  EXPECT_GE(last[3], 7) << "the last stage must shed a layer";
  EXPECT_EQ(FirstReturn(job.layouts()), "");
}

}  // namespace
}  // namespace dynmo::service
