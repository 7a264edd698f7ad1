#include "coordinator/service/job_state.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>

#include "absl/synchronization/mutex.h"
#include "coordinator/service/job_registry.h"
#include "coordinator/service/metrics.h"
#include "gtest/gtest.h"
#include "tests/service/job_state_fixture.h"

namespace dynmo::service {
namespace {

TEST_F(JobStateTest, RebalanceSendsPrepareToEveryRankWithApplyAhead) {
  ReportAll(3);
  auto r = job_->Rebalance(absl::Now());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->issued());
  EXPECT_EQ(r->plan().epoch(), 1u);
  EXPECT_EQ(r->plan().apply_iteration(), 3 + 5);
  EXPECT_NE(r->plan().boundaries(1), 2) << "the heavy stage 0 must shrink";
  for (auto& s : sinks_) {
    auto msgs = s->Take();
    ASSERT_EQ(msgs.size(), 1u);
    EXPECT_TRUE(msgs[0].has_prepare());
    EXPECT_EQ(msgs[0].prepare().epoch(), 1u);
  }
  EXPECT_EQ(job_->Summary().plan_state(), "preparing");
}

TEST_F(JobStateTest, CommitOnlyAfterEveryRankPrepared) {
  const auto plan = Issue();
  for (auto& s : sinks_) s->Take();
  for (int r = 0; r < kStages - 1; ++r) {
    ASSERT_TRUE(job_->OnAck(r, Ack(plan.epoch(), PlanAck::PREPARED)).ok());
  }
  for (auto& s : sinks_) EXPECT_TRUE(s->Take().empty());
  // A duplicate PREPARED does not count twice.
  ASSERT_TRUE(job_->OnAck(0, Ack(plan.epoch(), PlanAck::PREPARED)).ok());
  for (auto& s : sinks_) EXPECT_TRUE(s->Take().empty());
  ASSERT_TRUE(job_->OnAck(kStages - 1, Ack(plan.epoch(), PlanAck::PREPARED)).ok());
  for (auto& s : sinks_) {
    auto msgs = s->Take();
    ASSERT_EQ(msgs.size(), 1u);
    ASSERT_TRUE(msgs[0].has_commit());
    EXPECT_EQ(msgs[0].commit().apply_iteration(), plan.apply_iteration());
  }
  EXPECT_EQ(job_->Summary().plan_state(), "committed");
}

TEST_F(JobStateTest, AppliedAckMovesTheLayoutAndDuplicatesAreNoOps) {
  const auto plan = Issue();
  for (int r = 0; r < kStages; ++r) {
    ASSERT_TRUE(job_->OnAck(r, Ack(plan.epoch(), PlanAck::PREPARED)).ok());
  }
  ASSERT_TRUE(job_->OnAck(2, Ack(plan.epoch(), PlanAck::APPLIED)).ok());
  auto st = job_->Status();
  EXPECT_EQ(st.summary().applied_epoch(), plan.epoch());
  EXPECT_EQ(std::vector<int>(st.boundaries().begin(), st.boundaries().end()),
            std::vector<int>(plan.boundaries().begin(), plan.boundaries().end()));
  ASSERT_EQ(st.history_size(), 1);
  EXPECT_EQ(st.history(0).outcome(), dynmo::v1::PLAN_OUTCOME_APPLIED);
  // Late duplicates of any kind for a settled epoch change nothing.
  ASSERT_TRUE(job_->OnAck(1, Ack(plan.epoch(), PlanAck::APPLIED)).ok());
  ASSERT_TRUE(job_->OnAck(3, Ack(plan.epoch(), PlanAck::FAILED)).ok());
  EXPECT_EQ(job_->Status().history(0).outcome(),
            dynmo::v1::PLAN_OUTCOME_APPLIED);
}

TEST_F(JobStateTest, LatePreparedAfterCommitGetsOnlyTheCommitAgain) {
  const auto plan = Issue();
  for (int r = 0; r < kStages; ++r) {
    ASSERT_TRUE(job_->OnAck(r, Ack(plan.epoch(), PlanAck::PREPARED)).ok());
  }
  for (auto& s : sinks_) s->Take();
  // A reconnecting rank re-acks PREPARED: it gets the COMMIT, and no new
  // PREPARE (which would draw another PREPARED, forever).
  ASSERT_TRUE(job_->OnAck(2, Ack(plan.epoch(), PlanAck::PREPARED)).ok());
  auto msgs = sinks_[2]->Take();
  ASSERT_EQ(msgs.size(), 1u);
  EXPECT_TRUE(msgs[0].has_commit());
}

TEST_F(JobStateTest, InBandCommitSendsOnePhase) {
  JobOptions o = options_;
  o.in_band_commit = true;
  JobState job(Reg(0), o, JobDeps{keeper_.get(), pool_.get(), nullptr});
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int r = 0; r < kStages; ++r) {
    dynmo::v1::RegisterResponse resp;
    ASSERT_TRUE(job.Register(Reg(r), &resp).ok());
    sinks.push_back(std::make_shared<RecordingSink>());
    ASSERT_TRUE(job.Attach(r, resp.session_key(), sinks.back()).ok());
    ASSERT_TRUE(job.OnReport(r, Report(r, 0)).ok());
  }
  auto reb = job.Rebalance(absl::Now());
  ASSERT_TRUE(reb.ok() && reb->issued());
  EXPECT_TRUE(reb->plan().commit_with_prepare());
  EXPECT_EQ(job.Summary().plan_state(), "committed");
  for (int r = 0; r < kStages; ++r) {
    ASSERT_TRUE(job.OnAck(r, Ack(reb->plan().epoch(), PlanAck::PREPARED)).ok());
  }
  for (auto& s : sinks) {
    auto msgs = s->Take();
    ASSERT_EQ(msgs.size(), 1u) << "a PREPARE and no COMMIT";
    EXPECT_TRUE(msgs[0].has_prepare());
  }
  ASSERT_TRUE(job.OnAck(1, Ack(reb->plan().epoch(), PlanAck::APPLIED)).ok());
  EXPECT_EQ(job.Summary().applied_epoch(), reb->plan().epoch());
}

TEST_F(JobStateTest, AFailedRankAbortsForEveryone) {
  const auto plan = Issue();
  for (auto& s : sinks_) s->Take();
  ASSERT_TRUE(job_->OnAck(1, Ack(plan.epoch(), PlanAck::FAILED)).ok());
  for (auto& s : sinks_) {
    auto msgs = s->Take();
    ASSERT_EQ(msgs.size(), 1u);
    EXPECT_TRUE(msgs[0].has_abort());
  }
  auto st = job_->Status();
  EXPECT_EQ(st.summary().applied_epoch(), 0u);
  EXPECT_EQ(st.history(0).outcome(), dynmo::v1::PLAN_OUTCOME_ABORTED);
  // The next plan gets a new epoch: epochs are never reused.
  EXPECT_EQ(Issue().epoch(), 2u);
}

TEST_F(JobStateTest, PrepareTimeoutAndTooLateAbort) {
  const auto plan = Issue();
  job_->Tick(absl::Now() + absl::Seconds(60));
  EXPECT_EQ(job_->Status().history(0).outcome(),
            dynmo::v1::PLAN_OUTCOME_ABORTED);
  const auto second = Issue();
  // A rank reports the iteration just before the apply iteration: too late
  // to commit safely.
  ASSERT_TRUE(job_->OnReport(0, Report(0, second.apply_iteration() - 1)).ok());
  job_->Tick(absl::Now());
  EXPECT_EQ(job_->Status().history(1).outcome(),
            dynmo::v1::PLAN_OUTCOME_ABORTED);
  (void)plan;
}

TEST_F(JobStateTest, CommittedPlanIsSettledByReportsOfTheApplyIteration) {
  const auto plan = Issue();
  for (int r = 0; r < kStages; ++r) {
    ASSERT_TRUE(job_->OnAck(r, Ack(plan.epoch(), PlanAck::PREPARED)).ok());
  }
  // The APPLIED acks were lost; a report of the apply iteration that ran
  // under the new epoch settles it.
  ASSERT_TRUE(
      job_->OnReport(0, Report(0, plan.apply_iteration(), plan.epoch())).ok());
  EXPECT_EQ(job_->Summary().applied_epoch(), plan.epoch());
}

TEST_F(JobStateTest, MalformedReportsAreRejectedAndChangeNothing) {
  ReportAll(0);
  const auto before = job_->Summary();
  auto nan = Report(0, 1);
  nan.mutable_layers(0)->set_fwd_s(std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(job_->OnReport(0, nan).code(), absl::StatusCode::kInvalidArgument);
  auto neg = Report(0, 1);
  neg.mutable_layers(0)->set_bwd_s(-1);
  EXPECT_EQ(job_->OnReport(0, neg).code(), absl::StatusCode::kInvalidArgument);
  auto out_of_range = Report(0, 1);
  out_of_range.mutable_layers(0)->set_layer(kLayers);
  EXPECT_EQ(job_->OnReport(0, out_of_range).code(),
            absl::StatusCode::kInvalidArgument);
  auto dup = Report(0, 1);
  dup.mutable_layers(1)->set_layer(dup.layers(0).layer());
  EXPECT_EQ(job_->OnReport(0, dup).code(), absl::StatusCode::kInvalidArgument);
  auto future = Report(0, 1, /*epoch=*/9);
  EXPECT_EQ(job_->OnReport(0, future).code(), absl::StatusCode::kInvalidArgument);
  // Finite but absurd: they would show as +Inf in sums, overflow byte
  // totals, or push the next plan's apply iteration past INT64_MAX.
  auto huge_time = Report(0, 1);
  huge_time.mutable_layers(0)->set_fwd_s(1e308);
  EXPECT_EQ(job_->OnReport(0, huge_time).code(), absl::StatusCode::kInvalidArgument);
  auto huge_bytes = Report(0, 1);
  huge_bytes.mutable_layers(0)->set_resident_bytes(int64_t{1} << 62);
  EXPECT_EQ(job_->OnReport(0, huge_bytes).code(), absl::StatusCode::kInvalidArgument);
  auto last_iteration = Report(0, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(job_->OnReport(0, last_iteration).code(), absl::StatusCode::kInvalidArgument);
  const auto after = job_->Summary();
  EXPECT_EQ(after.reports(), before.reports());
  EXPECT_EQ(after.last_iteration(), before.last_iteration());
}

TEST_F(JobStateTest, RegistrationsThatDoNotFitTheJobAreRefused) {
  dynmo::v1::RegisterResponse resp;
  auto r = Reg(1);
  r.set_num_layers(kLayers + 1);
  EXPECT_EQ(job_->Register(r, &resp).code(),
            absl::StatusCode::kFailedPrecondition);
  r = Reg(1);
  r.set_pipeline_rank(2);  // stage 2 belongs to rank 2
  EXPECT_EQ(job_->Register(r, &resp).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobStateTest, AckForAnEpochNeverIssuedIsInvalid) {
  EXPECT_EQ(job_->OnAck(0, Ack(5, PlanAck::PREPARED)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(job_->OnAck(0, Ack(0, PlanAck::PREPARED)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(JobStateTest, EveryNTriggerIssuesOnItsOwn) {
  dynmo::v1::Policy p;
  p.set_trigger("every:5");
  ASSERT_TRUE(job_->SetPolicy(p).ok());
  for (int it = 0; it < 5; ++it) {
    ReportAll(it);
    job_->Tick(absl::Now());
  }
  EXPECT_EQ(job_->Summary().plan_state(), "preparing");
  EXPECT_EQ(job_->Summary().epoch(), 1u);
}

TEST_F(JobStateTest, OnEventTriggerWaitsForAModelChange) {
  dynmo::v1::Policy p;
  p.set_trigger("on-event");
  ASSERT_TRUE(job_->SetPolicy(p).ok());
  for (int it = 0; it < 5; ++it) {
    ReportAll(it);
    job_->Tick(absl::Now());
  }
  EXPECT_EQ(job_->Summary().epoch(), 0u) << "no event, no plan";
  auto changed = Report(0, 5);
  changed.set_model_changed(true);
  ASSERT_TRUE(job_->OnReport(0, changed).ok());
  job_->Tick(absl::Now());
  EXPECT_EQ(job_->Summary().epoch(), 0u)
      << "the other stages have not reported their costs after the change yet";
  for (int r = 1; r < kStages; ++r) {
    ASSERT_TRUE(job_->OnReport(r, Report(r, 5)).ok());
  }
  job_->Tick(absl::Now());
  EXPECT_EQ(job_->Summary().epoch(), 1u);
}

TEST_F(JobStateTest, AutoTriggerIssuesOnlyAfterRepeatedPayback) {
  dynmo::v1::Policy p;
  p.set_trigger("auto");
  ASSERT_TRUE(job_->SetPolicy(p).ok());
  // 4x heavy layers on one stage: the gain pays back 1 MiB moves at once,
  // but only the third consecutive positive verdict issues the plan.
  ReportAll(0);
  job_->Tick(absl::Now());
  EXPECT_EQ(job_->Summary().epoch(), 0u);
  ReportAll(1);
  job_->Tick(absl::Now());
  EXPECT_EQ(job_->Summary().epoch(), 0u);
  ReportAll(2);
  job_->Tick(absl::Now());
  EXPECT_EQ(job_->Summary().epoch(), 1u);
}

TEST_F(JobStateTest, AutoTriggerLeavesABalancedJobAlone) {
  dynmo::v1::Policy p;
  p.set_trigger("auto");
  ASSERT_TRUE(job_->SetPolicy(p).ok());
  for (int it = 0; it < 50; ++it) {
    for (int r = 0; r < kStages; ++r) {
      dynmo::v1::IterationReport rep;
      rep.set_iteration(it);
      for (int l = 2 * r; l < 2 * r + 2; ++l) {
        auto* s = rep.add_layers();
        s->set_layer(l);
        // +-1% noise around equal layers.
        s->set_fwd_s(0.01 * (1 + 0.01 * (((it * 7 + l * 3) % 5) - 2)));
      }
      ASSERT_TRUE(job_->OnReport(r, rep).ok());
    }
    job_->Tick(absl::Now());
  }
  EXPECT_EQ(job_->Summary().epoch(), 0u) << "noise must not cause plans";
}

TEST_F(JobStateTest, RestartKeepsTheEpochAndAbortsAnUncommittedPlan) {
  const auto plan = Issue();
  StateKeeper keeper(dir_);
  auto state = keeper.Open();
  ASSERT_TRUE(state.ok());
  ASSERT_EQ(state->jobs_size(), 1);
  EXPECT_EQ(state->jobs(0).epoch(), plan.epoch());
  ReleasedPool pool(&keeper);
  JobState restored(state->jobs(0), options_, JobDeps{&keeper, &pool, nullptr});
  auto st = restored.Status();
  EXPECT_EQ(st.summary().epoch(), plan.epoch());
  EXPECT_EQ(st.summary().plan_state(), "idle");
  ASSERT_EQ(st.history_size(), 1);
  EXPECT_EQ(st.history(0).outcome(), dynmo::v1::PLAN_OUTCOME_ABORTED);
}

TEST_F(JobStateTest, RankThatRestartedWithoutTheCommittedPlanAbortsIt) {
  const auto plan = Issue();
  for (int r = 0; r < kStages; ++r) {
    ASSERT_TRUE(job_->OnAck(r, Ack(plan.epoch(), PlanAck::PREPARED)).ok());
  }
  dynmo::v1::RegisterResponse resp;
  ASSERT_TRUE(job_->Register(Reg(2), &resp).ok());  // pending_epoch 0
  EXPECT_EQ(job_->Status().history(0).outcome(),
            dynmo::v1::PLAN_OUTCOME_ABORTED);
}

TEST_F(JobStateTest, ANewerSessionSupersedesTheOldOne) {
  auto fresh = std::make_shared<RecordingSink>();
  ASSERT_TRUE(job_->Attach(1, keys_[1], fresh).ok());
  EXPECT_EQ(sinks_[1]->closed().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(job_->Attach(99, keys_[1], fresh).code(), absl::StatusCode::kNotFound);
}

TEST_F(JobStateTest, ASessionIsBoundToItsRanksNewestRegistration) {
  auto hijack = std::make_shared<RecordingSink>();
  // No key, another rank's key, a made-up key: refused, rank 2's session kept.
  for (const std::string& key : {std::string(), keys_[1], std::string(32, 'a')}) {
    const absl::Status s = job_->Attach(2, key, hijack);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << key;
    EXPECT_NE(s.message().find("register again"), std::string::npos) << s;
  }
  EXPECT_TRUE(sinks_[2]->closed().ok()) << "a refused session closed the real one";
  // A new Register issues a new key; the old one stops working.
  dynmo::v1::RegisterResponse resp;
  ASSERT_TRUE(job_->Register(Reg(2), &resp).ok());
  EXPECT_NE(resp.session_key(), keys_[2]);
  EXPECT_EQ(resp.session_key().size(), 32u);
  EXPECT_EQ(job_->Attach(2, keys_[2], hijack).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(job_->Attach(2, resp.session_key(), hijack).ok());
}

TEST(JobStateRepackTest, RepackReleasesStagesIntoThePool) {
  StateKeeper keeper("");
  ASSERT_TRUE(keeper.Open().ok());
  ReleasedPool pool(&keeper);
  JobOptions options;
  options.default_policy.trigger.kind = Trigger::Kind::kManual;
  options.default_policy.repack = true;
  JobState job(Reg(0), options, JobDeps{&keeper, &pool, nullptr});
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int r = 0; r < kStages; ++r) {
    dynmo::v1::RegisterResponse resp;
    ASSERT_TRUE(job.Register(Reg(r), &resp).ok());
    sinks.push_back(std::make_shared<RecordingSink>());
    ASSERT_TRUE(job.Attach(r, resp.session_key(), sinks.back()).ok());
  }
  // Layer 0 dominates: one stage for it and one for the rest lose nothing.
  for (int r = 0; r < kStages; ++r) {
    dynmo::v1::IterationReport rep;
    rep.set_iteration(0);
    for (int l = 2 * r; l < 2 * r + 2; ++l) {
      auto* s = rep.add_layers();
      s->set_layer(l);
      s->set_fwd_s(l == 0 ? 1.0 : 0.001);
    }
    ASSERT_TRUE(job.OnReport(r, rep).ok());
  }
  auto reb = job.Rebalance(absl::Now());
  ASSERT_TRUE(reb.ok()) << reb.status();
  ASSERT_TRUE(reb->issued());
  const auto& plan = reb->plan();
  ASSERT_GT(plan.released_stages_size(), 0);
  EXPECT_EQ(plan.split_size(), kStages);
  for (int r = 0; r < kStages; ++r) {
    ASSERT_TRUE(job.OnAck(r, Ack(plan.epoch(), PlanAck::PREPARED)).ok());
  }
  ASSERT_TRUE(job.OnAck(0, Ack(plan.epoch(), PlanAck::APPLIED)).ok());
  auto released = pool.List("job", false);
  EXPECT_EQ(static_cast<int>(released.size()), plan.released_stages_size());
  EXPECT_EQ(job.Summary().active_stages(),
            kStages - plan.released_stages_size());
}

// ---- Deletion and expiry (JobState::Close, JobRegistry::Delete) ----

class JobDeletionTest : public StateDirTest {
 protected:
  void SetUp() override {
    StateDirTest::SetUp();
    options_.default_policy.trigger.kind = Trigger::Kind::kManual;
    registry_ = std::make_unique<JobRegistry>(
        options_, JobDeps{keeper_.get(), pool_.get(), &metrics_}, JobLimits{/*max_jobs=*/4});
    std::string key0;
    for (int r = 0; r < kStages; ++r) {
      dynmo::v1::RegisterResponse resp;
      auto job = registry_->Register(Reg(r), &resp);
      ASSERT_TRUE(job.ok()) << job.status();
      job_ = *job;
      if (r == 0) key0 = resp.session_key();
    }
    sink_ = std::make_shared<RecordingSink>();
    ASSERT_TRUE(job_->Attach(0, key0, sink_).ok());
    ASSERT_TRUE(job_->OnReport(0, Report(0, 1)).ok());
  }

  std::string MetricsText() {
    std::string text;
    for (const auto& family : metrics_.registry()->Collect()) {
      for (const auto& m : family.metric) {
        for (const auto& l : m.label) text += l.name + "=" + l.value + ";";
      }
    }
    return text;
  }

  JobOptions options_;
  CoordinatorMetrics metrics_;
  std::unique_ptr<JobRegistry> registry_;
  std::shared_ptr<JobState> job_;
  std::shared_ptr<RecordingSink> sink_;
};

TEST_F(JobDeletionTest, AJobWithConnectedRanksIsKeptUnlessForced) {
  auto refused = registry_->Delete("job", false);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("1 connected ranks"), std::string::npos)
      << refused.status();
  EXPECT_TRUE(registry_->Find("job").ok());
  EXPECT_EQ(registry_->Delete("nope", true).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobDeletionTest, ForceDeletionEndsSessionsAndForgetsRecordAndSeries) {
  EXPECT_NE(MetricsText().find("job=job;"), std::string::npos);
  auto closed = registry_->Delete("job", true);
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_EQ(*closed, 1);
  EXPECT_EQ(sink_->closed().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_->Find("job").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(MetricsText().find("job=job;"), std::string::npos)
      << "the deleted job's series are still exported";
  // What the deleted job's ranks still hold cannot act on it.
  const absl::Status late = job_->OnReport(0, Report(0, 2));
  EXPECT_EQ(late.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(late.message().find("was deleted"), std::string::npos) << late;
  // Not in the state dir any more.
  StateKeeper again(dir_);
  auto state = again.Open();
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->jobs_size(), 0);
  // The name is free: a rank that registers again makes a new job.
  dynmo::v1::RegisterResponse resp;
  auto fresh = registry_->Register(Reg(0), &resp);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_NE(fresh->get(), job_.get());
  EXPECT_TRUE((*fresh)->OnReport(0, Report(0, 1)).ok());
}

TEST_F(JobDeletionTest, AnIdleJobExpiresAndAConnectedOneDoesNot) {
  const absl::Time later = absl::Now() + absl::Hours(25);
  EXPECT_TRUE(registry_->ExpireIdle(later, absl::Hours(24)).empty())
      << "rank 0 is still connected";
  job_->Detach(0, sink_.get());
  EXPECT_TRUE(registry_->ExpireIdle(absl::Now(), absl::Hours(24)).empty())
      << "idle for less than the expiry";
  EXPECT_EQ(registry_->ExpireIdle(later, absl::Hours(24)),
            std::vector<std::string>{"job"});
  EXPECT_EQ(registry_->Find("job").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobDeletionTest, ADeletionTheStateDirRefusesKeepsTheJob) {
  job_->Detach(0, sink_.get());
  // The job's record cannot be removed: a non-empty directory in its place.
  const std::string record = dir_ + "/jobs/job.pb";
  ASSERT_EQ(rename(record.c_str(), (record + ".kept").c_str()), 0);
  ASSERT_EQ(mkdir(record.c_str(), 0755), 0);
  std::ofstream(record + "/x") << "x";
  EXPECT_EQ(registry_->Delete("job", false).status().code(), absl::StatusCode::kUnavailable);
  std::filesystem::remove_all(record);
  ASSERT_EQ(rename((record + ".kept").c_str(), record.c_str()), 0);
  auto job = registry_->Find("job");
  ASSERT_TRUE(job.ok());
  EXPECT_TRUE((*job)->OnReport(0, Report(0, 2)).ok()) << "the job is open again";
  EXPECT_NE(MetricsText().find("job=job;"), std::string::npos);
}

}  // namespace
}  // namespace dynmo::service
