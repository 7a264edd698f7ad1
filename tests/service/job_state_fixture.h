// The JobStateTest fixture and its helpers, shared by the tests of one
// job (job_state_test.cc, job_events_test.cc, job_window_test.cc,
// job_restart_test.cc): a 4-stage, 8-layer job with every rank registered
// and attached to a RecordingSink, in a fresh state dir.
#ifndef DYNMO_TESTS_SERVICE_JOB_STATE_FIXTURE_H_
#define DYNMO_TESTS_SERVICE_JOB_STATE_FIXTURE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "coordinator/service/job_state.h"
#include "tests/service/state_dir_fixture.h"
#include "gtest/gtest.h"

namespace dynmo::service {

using dynmo::v1::CoordinatorMessage;
using dynmo::v1::PlanAck;

class RecordingSink : public SessionSink {
 public:
  void SendTo(absl::Span<const int> /*ranks*/, std::shared_ptr<const CoordinatorMessage> m) override {
    absl::MutexLock lock(&mu_);
    sent_.push_back(*m);
  }
  void Close(const absl::Status& s) override {
    absl::MutexLock lock(&mu_);
    closed_ = s;
  }
  std::vector<CoordinatorMessage> Take() {
    absl::MutexLock lock(&mu_);
    std::vector<CoordinatorMessage> out;
    out.swap(sent_);
    return out;
  }
  absl::Status closed() {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  absl::Mutex mu_;
  std::vector<CoordinatorMessage> sent_;
  absl::Status closed_;
};

constexpr int kStages = 4;
constexpr int kLayers = 8;

inline dynmo::v1::RegisterRequest Reg(int rank) {
  dynmo::v1::RegisterRequest r;
  r.set_job("job");
  r.set_rank(rank);
  r.set_pipeline_rank(rank);
  r.set_data_parallel_rank(0);
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

// Layer 0 and 1 are 4x heavier than the rest: uniform [0,2,4,6,8] puts both
// on stage 0, so any exact balancer moves layers.
inline dynmo::v1::IterationReport Report(int stage, int64_t iteration,
                                  uint64_t epoch = 0) {
  dynmo::v1::IterationReport rep;
  rep.set_iteration(iteration);
  rep.set_applied_epoch(epoch);
  for (int l = 2 * stage; l < 2 * stage + 2; ++l) {
    auto* s = rep.add_layers();
    s->set_layer(l);
    const double t = l < 2 ? 0.04 : 0.01;
    s->set_fwd_s(t);
    s->set_bwd_s(t);
    s->set_wgrad_s(t);
    s->set_resident_bytes(1 << 20);
  }
  return rep;
}

inline PlanAck Ack(uint64_t epoch, PlanAck::State state, int64_t iteration = 0) {
  PlanAck a;
  a.set_epoch(epoch);
  a.set_state(state);
  a.set_iteration(iteration);
  return a;
}

class JobStateTest : public StateDirTest {
 protected:
  void SetUp() override {
    StateDirTest::SetUp();
    options_.default_policy.trigger.kind = Trigger::Kind::kManual;
    options_.plan_lead_iterations = 5;
    job_ = std::make_unique<JobState>(Reg(0), options_,
                                      JobDeps{keeper_.get(), pool_.get(), nullptr});
    for (int r = 0; r < kStages; ++r) {
      dynmo::v1::RegisterResponse resp;
      ASSERT_TRUE(job_->Register(Reg(r), &resp).ok());
      keys_.push_back(resp.session_key());
      sinks_.push_back(std::make_shared<RecordingSink>());
      ASSERT_TRUE(job_->Attach(r, resp.session_key(), sinks_.back()).ok());
    }
  }

  void ReportAll(int64_t iteration, uint64_t epoch = 0) {
    for (int r = 0; r < kStages; ++r) {
      ASSERT_TRUE(job_->OnReport(r, Report(r, iteration, epoch)).ok());
    }
  }

  // Issues a plan through the operator path and returns it.
  dynmo::v1::Plan Issue() {
    ReportAll(0);
    auto r = job_->Rebalance(absl::Now());
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->issued()) << r->detail();
    return r->plan();
  }

  JobOptions options_;
  std::unique_ptr<JobState> job_;
  std::vector<std::shared_ptr<RecordingSink>> sinks_;
  std::vector<std::string> keys_;  // each rank's session key
};

}  // namespace dynmo::service

#endif  // DYNMO_TESTS_SERVICE_JOB_STATE_FIXTURE_H_
