// JobReplay: a trace replayed through the coordinator's own JobMachine, and
// the same samples fed to a live JobState (the daemon's shell, with its
// state keeper on disk) yield the same plans at the same iterations.
#include "coordinator/job/job_replay.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/partition.h"
#include "core/scenario.h"
#include "formats/trace_json.h"
#include "coordinator/service/job_state.h"
#include "coordinator/service/released_pool.h"
#include "coordinator/service/state_store.h"
#include "gtest/gtest.h"

namespace dynmo::service {
namespace {

// 16 equal layers; from iteration 40 the first four cost four times as much
// (a step a live job's ranks would flag), with 2% deterministic jitter.
core::Trace StepTrace(int records = 120) {
  core::Trace trace;
  for (int i = 0; i < records; ++i) {
    core::TraceRecord r;
    r.iter = i;
    for (int l = 0; l < 16; ++l) {
      const double jitter = 1 + 0.02 * (((i * 7 + l * 13) % 11) - 5) / 5.0;
      const double base = (i >= 40 && l < 4 ? 4.0 : 1.0) * 0.01 * jitter;
      r.layers.push_back({base, 2 * base, 0, 64 << 20});
    }
    trace.push_back(std::move(r));
  }
  return trace;
}

// StepTrace without the step: 16 equal layers with the same 2% jitter.
core::Trace FlatTrace(int records) {
  core::Trace trace = StepTrace(records);
  for (core::TraceRecord& r : trace) {
    for (int l = 0; l < 16; ++l) {
      const double base = 0.01 * (1 + 0.02 * (((r.iter * 7 + l * 13) % 11) - 5) / 5.0);
      r.layers[static_cast<size_t>(l)] = {base, 2 * base, 0, 64 << 20};
    }
  }
  return trace;
}

JobReplayConfig Config(Trigger trigger) {
  JobReplayConfig c;
  c.pp = 4;
  c.microbatches = 8;
  c.migration_bandwidth_bytes_per_s = 10e9;
  c.options.default_policy.trigger = trigger;
  return c;
}

TEST(JobReplayTest, AutoFollowsAStepWithTheDaemonsRules) {
  const JobReplayConfig c = Config(Trigger{Trigger::Kind::kAuto});
  absl::StatusOr<JobReplayResult> r = ReplayJob(StepTrace(), c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->iterations, 120);
  ASSERT_GE(r->plans.size(), 1u);
  const ReplayedPlan& p = r->plans.front();
  EXPECT_EQ(p.reason, "auto");
  EXPECT_GT(p.decided_iteration, 40) << "decided after the step";
  EXPECT_EQ(p.apply_iteration, p.decided_iteration + c.options.plan_lead_iterations);
  EXPECT_EQ(p.outcome, "applied");
  EXPECT_GT(r->final_boundaries[1], 0);
  EXPECT_LT(r->final_boundaries[1], 4) << "stage 0 sheds the heavy layers";
  EXPECT_GT(r->speedup, 1.2);
}

TEST(JobReplayTest, AStationaryJobGetsNoPlanUnderAuto) {
  core::Trace flat = StepTrace(60);
  flat.resize(40);  // before the step: equal layers and jitter only
  absl::StatusOr<JobReplayResult> r =
      ReplayJob(flat, Config(Trigger{Trigger::Kind::kAuto}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->plans.empty());
  EXPECT_DOUBLE_EQ(r->speedup, 1.0);
}

TEST(JobReplayTest, EveryNAppliesAfterThePlanLead) {
  JobReplayConfig c = Config(Trigger{Trigger::Kind::kEvery, 10});
  absl::StatusOr<JobReplayResult> r = ReplayJob(StepTrace(), c);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_FALSE(r->plans.empty());
  for (const ReplayedPlan& p : r->plans) {
    EXPECT_EQ(p.reason, "every:10");
    EXPECT_EQ(p.apply_iteration, p.decided_iteration + c.options.plan_lead_iterations);
  }
}

TEST(JobReplayTest, RepackReleasesStagesAndCountsFewerGpuSeconds) {
  // Light layers everywhere after iteration 20: half the stages suffice.
  core::Trace trace;
  for (int i = 0; i < 80; ++i) {
    core::TraceRecord r;
    r.iter = i;
    for (int l = 0; l < 16; ++l) {
      const double t = (i >= 20 && l >= 4 ? 0.001 : 0.01);
      r.layers.push_back({t, 2 * t, 0, 1 << 20});
    }
    trace.push_back(std::move(r));
  }
  JobReplayConfig c = Config(Trigger{Trigger::Kind::kEvery, 10});
  c.options.default_policy.repack = true;
  c.options.default_policy.repack_tolerance = 0.05;
  absl::StatusOr<JobReplayResult> r = ReplayJob(trace, c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(r->final_pp, 4);
  EXPECT_LT(r->dynamic_gpu_s, r->static_gpu_s);
}

TEST(JobReplayTest, BadConfigsGetOneLine) {
  JobReplayConfig c = Config(Trigger{Trigger::Kind::kOnChange});
  absl::StatusOr<JobReplayResult> r = ReplayJob(StepTrace(10), c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("on-change"), std::string::npos);
  c = Config(Trigger{Trigger::Kind::kAuto});
  c.pp = 17;
  EXPECT_FALSE(ReplayJob(StepTrace(10), c).ok());
  c.pp = 4;
  c.schedule = "nope";
  EXPECT_FALSE(ReplayJob(StepTrace(10), c).ok());
  EXPECT_FALSE(ReplayJob(core::Trace{}, Config(Trigger{Trigger::Kind::kAuto})).ok());
}

// A straggler appears mid-run and recovers: the coordinator finds it from
// the speed probes (layer times alone would price the layers it moves at
// the slow rank's time), moves layers off it once, and back after.
TEST(JobReplayTest, AStragglerIsFollowedOnceAndRecoveryToo) {
  const core::Trace flat = FlatTrace(200);
  JobReplayConfig c = Config(Trigger{Trigger::Kind::kAuto});
  c.stragglers = {SpeedChange{2, 0.5, 40, 120}};
  c.oracle = true;
  absl::StatusOr<JobReplayResult> r = ReplayJob(flat, c);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_GE(r->plans.size(), 2u);
  // Off the slow stage 2 after it slowed, back to uniform after it recovered.
  const ReplayedPlan& off = r->plans[0];
  EXPECT_GT(off.decided_iteration, 40);
  EXPECT_LT(off.decided_iteration, 80);
  EXPECT_LT(off.boundaries[3] - off.boundaries[2], 4) << "stage 2 holds fewer layers";
  const ReplayedPlan& back = r->plans.back();
  EXPECT_GT(back.decided_iteration, 120);
  EXPECT_EQ(back.boundaries, (core::Boundaries{0, 4, 8, 12, 16}));
  EXPECT_LE(r->plans.size(), 3u) << "no flip-flop";
  EXPECT_GT(r->speedup, 1.05);
  EXPECT_LE(r->speedup, r->oracle_speedup + 1e-9);
}

// Two blocks per stage: a straggler's layers move within the probes'
// confirmation of each step, and once each way. Its layers' costs start
// again when its speed is published (the times taken while the probes were
// confirming it mixed two speeds, and their scatter would read as noise
// holding every plan back), and no plan is made while a rank's probes say
// it may have sped up (its layers, priced at the old speed, would look
// cheap to every other rank).
TEST(JobReplayTest, AStragglerIsFollowedWithinItsProbesEachWay) {
  const core::Trace flat = FlatTrace(200);
  JobReplayConfig c = Config(Trigger{Trigger::Kind::kAuto});
  c.pp = 8;
  c.microbatches = 16;
  c.stragglers = {SpeedChange{2, 0.5, 40, 120}};
  absl::StatusOr<JobReplayResult> r = ReplayJob(flat, c);
  ASSERT_TRUE(r.ok()) << r.status();
  // Probes every 5 iterations, 3 to confirm a step, 3 verdicts in a row.
  const int64_t bound = 3 * c.probe_every + 3;
  ASSERT_EQ(r->plans.size(), 2u) << "once each way";
  const ReplayedPlan& off = r->plans[0];
  EXPECT_GT(off.decided_iteration, 40);
  EXPECT_LE(off.decided_iteration, 40 + bound);
  EXPECT_EQ(off.boundaries[3] - off.boundaries[2], 1) << "stage 2 holds one block";
  const ReplayedPlan& back = r->plans[1];
  EXPECT_GT(back.decided_iteration, 120);
  EXPECT_LE(back.decided_iteration, 120 + bound);
  EXPECT_EQ(back.boundaries, core::PartitionUniform(16, 8));
  EXPECT_GT(r->speedup, 1.04);
}

TEST(JobReplayTest, EqualRanksWithNoisyProbesNeverMoveLayers) {
  core::Trace flat = StepTrace(40);  // before the step: equal layers, jitter
  JobReplayConfig c = Config(Trigger{Trigger::Kind::kAuto});
  c.probe_every = 1;
  absl::StatusOr<JobReplayResult> r = ReplayJob(flat, c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->plans.empty());
}

// The daemon's JobState behind the replay: the same messages through its
// lock, send queue and state keeper.
class LiveTarget : public ReplayTarget {
 public:
  LiveTarget(const dynmo::v1::RegisterRequest& first, const JobOptions& options,
             const std::string& dir)
      : keeper_(std::make_unique<StateKeeper>(dir)), pool_(keeper_.get()),
        job_(first, options, JobDeps{keeper_.get(), &pool_, nullptr}) {}
  absl::Status Open() { return keeper_->Open().status(); }

  absl::Status Register(absl::Span<const dynmo::v1::RegisterRequest> ranks,
                        std::vector<dynmo::v1::RegisterResponse>* out) override {
    google::protobuf::RepeatedPtrField<dynmo::v1::RegisterRequest> all(ranks.begin(),
                                                                      ranks.end());
    return job_.RegisterMany(all, out);
  }
  absl::Status Attach(int rank, const std::string& key,
                      std::shared_ptr<SessionSink> sink) override {
    return job_.Attach(rank, key, std::move(sink));
  }
  absl::Status Upstream(absl::Span<const UpstreamMessage> messages, absl::Time) override {
    for (const UpstreamMessage& m : messages) {
      absl::Status s = m.report != nullptr ? job_.OnReport(m.rank, *m.report)
                                           : job_.OnAck(m.rank, *m.ack);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  void Tick(absl::Time now) override { job_.Tick(now); }

 private:
  std::unique_ptr<StateKeeper> keeper_;
  ReleasedPool pool_;
  JobState job_;
};

void ExpectSamePlans(const JobReplayResult& a, const JobReplayResult& b) {
  ASSERT_EQ(a.plans.size(), b.plans.size());
  for (size_t i = 0; i < a.plans.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(a.plans[i].epoch, b.plans[i].epoch);
    EXPECT_EQ(a.plans[i].decided_iteration, b.plans[i].decided_iteration);
    EXPECT_EQ(a.plans[i].apply_iteration, b.plans[i].apply_iteration);
    EXPECT_EQ(a.plans[i].reason, b.plans[i].reason);
    EXPECT_EQ(a.plans[i].outcome, b.plans[i].outcome);
    EXPECT_EQ(a.plans[i].boundaries, b.plans[i].boundaries);
    EXPECT_EQ(a.plans[i].active_stages, b.plans[i].active_stages);
  }
  EXPECT_DOUBLE_EQ(a.dynamic_total_s, b.dynamic_total_s);
}

std::string TempDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/dynmo-replay-" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(JobReplayTest, ARecordedTraceDecidesAlikeInTheReplayAndTheLiveDaemon) {
  // The early-exit trace shipped with the examples (16 iterations recorded
  // by the scenario generator) and a seeded MoE scenario, under auto and
  // every:N, with re-packing.
  std::ifstream in(std::string(DYNMO_SOURCE_DIR) + "/examples/trace-early-exit.jsonl");
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<core::Trace> recorded = formats::ParseTraceJsonl(text.str());
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  core::ScenarioConfig moe;
  moe.scenario = core::Scenario::kMoE;
  moe.layers = 24;
  moe.iterations = 150;
  absl::StatusOr<core::Trace> generated = core::GenerateScenario(moe);
  ASSERT_TRUE(generated.ok()) << generated.status();
  int compared = 0;
  for (const core::Trace& t : {*recorded, *generated, StepTrace()}) {
    for (Trigger trigger : {Trigger{Trigger::Kind::kAuto}, Trigger{Trigger::Kind::kEvery, 5}}) {
      for (bool repack : {false, true}) {
        JobReplayConfig c = Config(trigger);
        c.pp = std::min(4, static_cast<int>(t.front().layers.size()));
        c.options.default_policy.repack = repack;
        c.options.default_policy.repack_tolerance = 0.05;
        absl::StatusOr<JobReplayResult> replayed = ReplayJob(t, c);
        ASSERT_TRUE(replayed.ok()) << replayed.status();
        LiveTarget live(ReplayRegistration(t, c, 0), c.options,
                        TempDir(std::to_string(compared)));
        ASSERT_TRUE(live.Open().ok());
        absl::StatusOr<JobReplayResult> daemon = ReplayJob(t, c, &live);
        ASSERT_TRUE(daemon.ok()) << daemon.status();
        ExpectSamePlans(*replayed, *daemon);
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 12);
}

}  // namespace
}  // namespace dynmo::service
