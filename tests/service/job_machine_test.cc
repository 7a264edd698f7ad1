// JobMachine on its own: no lock, no keeper, no clock. Events in, effects
// out; durability through a journal the test controls.
#include "coordinator/job/job_machine.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/job/validation.h"
#include "gtest/gtest.h"
#include "tests/service/job_machine_helpers.h"

namespace dynmo::service {
namespace {

class JobMachineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.default_policy.trigger = Trigger{Trigger::Kind::kManual};
    options_.plan_lead_iterations = 5;
    machine_ = std::make_unique<JobMachine>(Reg(0), options_, &journal_);
    sinks_ = RegisterAndAttach(*machine_, {Reg(0), Reg(1)}, t0_);
    ASSERT_EQ(sinks_.size(), static_cast<size_t>(kStages));
  }

  static std::vector<UpstreamMessage> Upstream(
      const std::vector<dynmo::v1::IterationReport>& reports) {
    std::vector<UpstreamMessage> up;
    for (int r = 0; r < kStages; ++r) up.push_back({r, &reports[r], nullptr});
    return up;
  }

  void Report(int64_t iteration) {
    const std::vector<dynmo::v1::IterationReport> reports = SkewedReports(iteration);
    JobEffects fx;
    ASSERT_TRUE(machine_->OnUpstream(Upstream(reports), t0_, &fx).ok());
    EXPECT_EQ(fx.reports, kStages);
  }

  static void Deliver(const JobEffects& fx) {
    for (const auto& s : fx.sends) s.sink->SendTo(s.ranks, s.message);
  }

  JobOptions options_;
  Journal journal_;
  std::unique_ptr<JobMachine> machine_;
  std::vector<std::shared_ptr<Sink>> sinks_;
  absl::Time t0_ = absl::FromUnixSeconds(1'000'000);
};

TEST_F(JobMachineTest, IssueIsDurableBeforeItsPrepareIsAnEffect) {
  Report(3);
  JobEffects fx;
  auto r = machine_->Rebalance(t0_, &fx);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->issued());
  // The record naming epoch 1 was committed; the sends are effects only.
  ASSERT_FALSE(journal_.records.empty());
  EXPECT_EQ(journal_.records.back().epoch(), 1u);
  for (const auto& s : sinks_) EXPECT_TRUE(s->got.empty());
  ASSERT_EQ(fx.sends.size(), 2u);
  EXPECT_TRUE(fx.sends[0].message->has_prepare());
  EXPECT_EQ(fx.plans_issued, 1);
  EXPECT_TRUE(fx.measures_changed);
  EXPECT_EQ(fx.decision_latency_s.size(), 1u);
  ASSERT_FALSE(fx.events.empty());
  EXPECT_EQ(fx.events.back().name, "plan_issued");
  EXPECT_EQ(r->plan().apply_iteration(), 3 + 5);
}

TEST_F(JobMachineTest, AJournalFailureRetractsThePlanAndSendsNothing) {
  Report(3);
  journal_.fail = true;
  JobEffects fx;
  auto r = machine_->Rebalance(t0_, &fx);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("disk full"), std::string::npos);
  EXPECT_TRUE(fx.sends.empty());
  EXPECT_EQ(fx.plans_issued, 0);
  EXPECT_EQ(machine_->Summary().epoch(), 0u) << "the epoch was retracted";
  // Once the journal works again the same decision goes out as epoch 1.
  journal_.fail = false;
  JobEffects again;
  auto r2 = machine_->Rebalance(t0_, &again);
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(r2->plan().epoch(), 1u);
}

TEST_F(JobMachineTest, ACommitThatCannotBeSavedBecomesAnAbort) {
  Report(3);
  JobEffects fx;
  auto r = machine_->Rebalance(t0_, &fx);
  ASSERT_TRUE(r.ok() && r->issued());
  journal_.fail = true;
  JobEffects acks;
  const PlanAck a0 = [&] {
    PlanAck a;
    a.set_epoch(1);
    a.set_state(PlanAck::PREPARED);
    a.set_iteration(3);
    return a;
  }();
  const UpstreamMessage up[] = {{0, nullptr, &a0}, {1, nullptr, &a0}};
  ASSERT_TRUE(machine_->OnUpstream(up, t0_, &acks).ok());
  ASSERT_EQ(acks.sends.size(), 2u);
  EXPECT_TRUE(acks.sends[0].message->has_abort()) << "never a COMMIT that was not saved";
  EXPECT_EQ(acks.plans_aborted, 1);
  EXPECT_EQ(machine_->Summary().plan_state(), "idle");
}

TEST_F(JobMachineTest, SameEventsSameEffects) {
  // A second machine fed the same events decides the same, message for
  // message: nothing depends on a clock or a lock.
  Journal journal2;
  JobMachine twin(Reg(0), options_, &journal2);
  ASSERT_EQ(RegisterAndAttach(twin, {Reg(0), Reg(1)}, t0_).size(), static_cast<size_t>(kStages));
  JobEffects fx;
  Report(3);
  const std::vector<dynmo::v1::IterationReport> reports = SkewedReports(3);
  ASSERT_TRUE(twin.OnUpstream(Upstream(reports), t0_, &fx).ok());
  JobEffects a, b;
  auto ra = machine_->Rebalance(t0_, &a);
  auto rb = twin.Rebalance(t0_, &b);
  ASSERT_TRUE(ra.ok()) << ra.status();
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_EQ(ra->plan().SerializeAsString(), rb->plan().SerializeAsString());
  ASSERT_EQ(a.events.size(), b.events.size());
  for (size_t i = 0; i < a.events.size(); ++i) {
    EXPECT_EQ(a.events[i].name, b.events[i].name);
    ASSERT_EQ(a.events[i].fields.size(), b.events[i].fields.size());
    for (size_t f = 0; f < a.events[i].fields.size(); ++f) {
      EXPECT_EQ(a.events[i].fields[f].value(), b.events[i].fields[f].value());
    }
  }
}

TEST_F(JobMachineTest, AppliedPlanReportsItsBytesAndMovesTheLayout) {
  Report(3);
  JobEffects fx;
  auto r = machine_->Rebalance(t0_, &fx);
  ASSERT_TRUE(r.ok() && r->issued());
  Deliver(fx);
  PlanAck prepared;
  prepared.set_epoch(1);
  prepared.set_state(PlanAck::PREPARED);
  prepared.set_iteration(3);
  const UpstreamMessage p[] = {{0, nullptr, &prepared}, {1, nullptr, &prepared}};
  JobEffects commit;
  ASSERT_TRUE(machine_->OnUpstream(p, t0_, &commit).ok());
  ASSERT_EQ(commit.sends.size(), 2u);
  EXPECT_TRUE(commit.sends[0].message->has_commit());
  PlanAck applied = prepared;
  applied.set_state(PlanAck::APPLIED);
  applied.set_iteration(8);
  const UpstreamMessage a[] = {{0, nullptr, &applied}};
  JobEffects done;
  ASSERT_TRUE(machine_->OnUpstream(a, t0_, &done).ok());
  EXPECT_EQ(done.plans_applied, 1);
  EXPECT_EQ(done.migrated_bytes, static_cast<double>(r->plan().migration_bytes()));
  EXPECT_EQ(std::vector<int>(machine_->layout().boundaries.begin(),
                             machine_->layout().boundaries.end()),
            std::vector<int>(r->plan().boundaries().begin(), r->plan().boundaries().end()));
}

TEST_F(JobMachineTest, ARefusedBatchChangesNothing) {
  dynmo::v1::IterationReport good, bad;
  good.set_iteration(1);
  bad.set_iteration(1);
  auto* s = bad.add_layers();
  s->set_layer(kLayers + 3);  // no such layer
  const UpstreamMessage up[] = {{0, &good, nullptr}, {1, &bad, nullptr}};
  JobEffects fx;
  EXPECT_FALSE(machine_->OnUpstream(up, t0_, &fx).ok());
  EXPECT_EQ(fx.reports, 0);
  EXPECT_EQ(machine_->Summary().reports(), 0);
}


// The skewed job under auto, its ranks naming `planned` iterations in all:
// the iteration of its first plan, or -1 when none came in 30 iterations.
// `record`: the job's record then.
int64_t FirstAutoPlan(int64_t planned, dynmo::v1::JobRecord* record) {
  Journal journal;
  JobOptions o;
  o.plan_lead_iterations = 5;
  auto reg = [&](int rank) {
    dynmo::v1::RegisterRequest r = Reg(rank);
    r.set_planned_iterations(planned);
    return r;
  };
  JobMachine m(reg(0), o, &journal);
  const absl::Time t0 = absl::FromUnixSeconds(1'000'000);
  if (RegisterAndAttach(m, {reg(0), reg(1)}, t0).size() != kStages) return -2;
  for (int64_t it = 0; it < 30; ++it) {
    const std::vector<dynmo::v1::IterationReport> reports = SkewedReports(it);
    std::vector<UpstreamMessage> up;
    for (int r = 0; r < kStages; ++r) up.push_back({r, &reports[r], nullptr});
    JobEffects step;
    if (!m.OnUpstream(up, t0, &step).ok()) return -2;
    m.Tick(t0, &step);
    *record = m.Record();
    for (const auto& s : step.sends) {
      if (s.message->has_prepare()) return it;
    }
  }
  return -1;
}

// A run that names its length gets no plan it would end before repaying;
// the length is kept in the job's record.
TEST(JobMachinePlannedTest, NoPlanTheRunEndsBeforeRepaying) {
  dynmo::v1::JobRecord unknown, long_run, ending;
  const int64_t free_plan = FirstAutoPlan(0, &unknown);
  ASSERT_GE(free_plan, 0) << "the skewed job is re-balanced under auto";
  EXPECT_EQ(FirstAutoPlan(1000, &long_run), free_plan);
  // Ending right after the plan would apply (the lead is 5): nothing left.
  EXPECT_EQ(FirstAutoPlan(free_plan + 6, &ending), -1);
  EXPECT_EQ(ending.planned_iterations(), free_plan + 6);
  EXPECT_EQ(long_run.planned_iterations(), 1000);
  EXPECT_EQ(unknown.planned_iterations(), 0);
}

TEST(JobMachinePlannedTest, ANegativeLengthIsRefused) {
  dynmo::v1::RegisterRequest bad = Reg(0);
  bad.set_planned_iterations(-5);
  const absl::Status s = ValidateRegister(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("planned_iterations"), std::string::npos) << s;
  bad.set_planned_iterations(0);
  EXPECT_TRUE(ValidateRegister(bad).ok());
}

}  // namespace
}  // namespace dynmo::service
