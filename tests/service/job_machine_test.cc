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

namespace dynmo::service {
namespace {

using dynmo::v1::CoordinatorMessage;
using dynmo::v1::PlanAck;

constexpr int kStages = 2;
constexpr int kLayers = 8;

class Journal : public JobJournal {
 public:
  absl::Status Commit(const dynmo::v1::JobRecord& record) override {
    if (fail) return absl::UnavailableError("state not persisted (disk full)");
    records.push_back(record);
    return absl::OkStatus();
  }
  bool fail = false;
  std::vector<dynmo::v1::JobRecord> records;
};

class Sink : public SessionSink {
 public:
  void Send(std::shared_ptr<const CoordinatorMessage> m) override { got.push_back(*m); }
  void Close(const absl::Status&) override {}
  std::vector<CoordinatorMessage> got;
};

dynmo::v1::RegisterRequest Reg(int rank) {
  dynmo::v1::RegisterRequest r;
  r.set_job("m");
  r.set_rank(rank);
  r.set_pipeline_rank(rank);
  r.set_pipeline_size(kStages);
  r.set_data_parallel_size(1);
  r.set_num_layers(kLayers);
  r.set_host("h");
  r.set_microbatches(4);
  return r;
}

// Each rank's report of `iteration`: stage 0's layers cost three times
// stage 1's.
std::vector<dynmo::v1::IterationReport> SkewedReports(int64_t iteration) {
  std::vector<dynmo::v1::IterationReport> reports(kStages);
  for (int r = 0; r < kStages; ++r) {
    reports[r].set_iteration(iteration);
    for (int l = r * kLayers / 2; l < (r + 1) * kLayers / 2; ++l) {
      auto* s = reports[r].add_layers();
      s->set_layer(l);
      s->set_fwd_s(r == 0 ? 0.03 : 0.01);
      s->set_bwd_s(r == 0 ? 0.06 : 0.02);
      s->set_resident_bytes(1 << 20);
    }
  }
  return reports;
}

class JobMachineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.default_policy.trigger = Trigger{Trigger::Kind::kManual};
    options_.plan_lead_iterations = 5;
    machine_ = std::make_unique<JobMachine>(Reg(0), options_, &journal_);
    std::vector<dynmo::v1::RegisterRequest> regs = {Reg(0), Reg(1)};
    std::vector<const dynmo::v1::RegisterRequest*> all = {&regs[0], &regs[1]};
    std::vector<dynmo::v1::RegisterResponse> responses;
    JobEffects fx;
    ASSERT_TRUE(machine_->Register(all, t0_, &responses, &fx).ok());
    for (int r = 0; r < kStages; ++r) {
      sinks_.push_back(std::make_shared<Sink>());
      const int ranks[] = {r};
      const std::string keys[] = {responses[r].session_key()};
      ASSERT_TRUE(machine_->Attach(ranks, keys, false, sinks_[r], &fx).ok());
    }
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
  std::vector<dynmo::v1::RegisterRequest> regs = {Reg(0), Reg(1)};
  std::vector<const dynmo::v1::RegisterRequest*> all = {&regs[0], &regs[1]};
  std::vector<dynmo::v1::RegisterResponse> responses;
  JobEffects fx;
  ASSERT_TRUE(twin.Register(all, t0_, &responses, &fx).ok());
  for (int r = 0; r < kStages; ++r) {
    const int ranks[] = {r};
    const std::string keys[] = {responses[r].session_key()};
    ASSERT_TRUE(twin.Attach(ranks, keys, false, std::make_shared<Sink>(), &fx).ok());
  }
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

// A job of `slow.size()` one-rank stages over `layers` equal layers (an
// even split), rank r running `slow[r]` times slower: its probe and every
// layer it holds take that much longer. Registered, attached and fed 12
// iterations; returns whether a rank_speed event came.
bool FeedSlowRanks(JobMachine& m, const std::vector<double>& slow, int layers) {
  const int n = static_cast<int>(slow.size());
  auto reg = [&](int rank) {
    dynmo::v1::RegisterRequest r = Reg(rank);
    r.set_pipeline_size(n);
    r.set_num_layers(layers);
    return r;
  };
  std::vector<dynmo::v1::RegisterRequest> regs;
  for (int r = 0; r < n; ++r) regs.push_back(reg(r));
  std::vector<const dynmo::v1::RegisterRequest*> all;
  for (const auto& r : regs) all.push_back(&r);
  std::vector<dynmo::v1::RegisterResponse> responses;
  JobEffects fx;
  EXPECT_TRUE(m.Register(all, absl::UnixEpoch(), &responses, &fx).ok());
  for (int r = 0; r < n; ++r) {
    const int ranks[] = {r};
    const std::string keys[] = {responses[r].session_key()};
    EXPECT_TRUE(m.Attach(ranks, keys, false, std::make_shared<Sink>(), &fx).ok());
  }
  bool speed_event = false;
  const int per_rank = layers / n;
  for (int it = 0; it < 12; ++it) {
    std::vector<dynmo::v1::IterationReport> reports(static_cast<size_t>(n));
    std::vector<UpstreamMessage> up;
    for (int r = 0; r < n; ++r) {
      reports[r].set_iteration(it);
      reports[r].set_probe_s(0.001 * slow[r]);
      for (int l = r * per_rank; l < (r + 1) * per_rank; ++l) {
        auto* s = reports[r].add_layers();
        s->set_layer(l);
        s->set_fwd_s(0.01 * slow[r]);
        s->set_bwd_s(0.02 * slow[r]);
      }
      up.push_back({r, &reports[r], nullptr});
    }
    JobEffects step;
    EXPECT_TRUE(m.OnUpstream(up, absl::UnixEpoch(), &step).ok());
    for (const JobEvent& e : step.events) speed_event = speed_event || e.name == "rank_speed";
  }
  return speed_event;
}

std::vector<int> Ints(const google::protobuf::RepeatedField<int32_t>& f) {
  return std::vector<int>(f.begin(), f.end());
}

// A rank at half speed: its probe takes twice as long and so does every
// layer it holds. Priced at speed 1 its layers cost what the fast rank's
// do, so it gets the exact split for speeds {1, 0.5}: 7 of 10 equal layers
// on the fast rank (a model without speeds stops at 6: the layers it would
// move look twice as heavy as they are).
TEST(JobMachineSpeedTest, ASlowRankGetsTheExactSplitForItsSpeed) {
  JobOptions options;
  options.default_policy.trigger = Trigger{Trigger::Kind::kManual};
  Journal journal;
  dynmo::v1::RegisterRequest first = Reg(0);
  first.set_pipeline_size(2);
  first.set_num_layers(10);
  JobMachine m(first, options, &journal);
  EXPECT_TRUE(FeedSlowRanks(m, {1.0, 2.0}, 10));
  EXPECT_NEAR(m.speeds().speed(1), 0.5, 1e-9);
  const dynmo::v1::JobStatus status = m.Status();
  ASSERT_EQ(status.rank_speed_size(), 2);
  EXPECT_NEAR(status.rank_speed(1), 0.5, 1e-9);
  JobEffects decide;
  auto r = m.Rebalance(absl::UnixEpoch(), &decide);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->issued()) << r->detail();
  EXPECT_EQ(Ints(r->plan().boundaries()), (std::vector<int>{0, 7, 10}));
}

// Re-packing releases the slowest rank first, even in the middle of the
// pipeline: 3 stages over 6 layers, the middle one at half speed. On all
// three the best bottleneck is 3 layers' worth (3, 1, 2: the slow stage's
// one layer costs 2); the two fast stages reach it alone (3, 3), no pair of
// neighbours does (4, 1 slow = 4), so at tolerance 0 stage 1 is released
// and stages 0 and 2 become neighbours.
TEST(JobMachineSpeedTest, RepackingReleasesTheSlowRankFirst) {
  JobOptions options;
  options.default_policy.trigger = Trigger{Trigger::Kind::kManual};
  options.default_policy.repack = true;
  Journal journal;
  dynmo::v1::RegisterRequest first = Reg(0);
  first.set_pipeline_size(3);
  first.set_num_layers(6);
  JobMachine m(first, options, &journal);
  EXPECT_TRUE(FeedSlowRanks(m, {1.0, 2.0, 1.0}, 6));
  JobEffects decide;
  auto r = m.Rebalance(absl::UnixEpoch(), &decide);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->issued()) << r->detail();
  EXPECT_EQ(Ints(r->plan().active_stages()), (std::vector<int>{0, 2}));
  EXPECT_EQ(Ints(r->plan().released_stages()), (std::vector<int>{1}));
  EXPECT_EQ(Ints(r->plan().boundaries()), (std::vector<int>{0, 3, 6}));
}

// A job of pp stages x dp replicas over `layers` equal layers (an even
// split; rank = stage * dp + replica). Rank r's probe takes `probe_slow[r]`
// times the fast one's, its layers `layer_slow[r]` times; fed `iterations`.
void FeedReplicas(JobMachine& m, int pp, int dp, const std::vector<double>& probe_slow,
                  const std::vector<double>& layer_slow, int layers, int iterations,
                  const std::vector<double>& exchange_s = {}) {
  const int n = pp * dp;
  std::vector<dynmo::v1::RegisterRequest> regs;
  for (int rank = 0; rank < n; ++rank) {
    dynmo::v1::RegisterRequest r = Reg(rank);
    r.set_pipeline_rank(rank / dp);
    r.set_data_parallel_rank(rank % dp);
    r.set_pipeline_size(pp);
    r.set_data_parallel_size(dp);
    r.set_num_layers(layers);
    regs.push_back(r);
  }
  std::vector<const dynmo::v1::RegisterRequest*> all;
  for (const auto& r : regs) all.push_back(&r);
  std::vector<dynmo::v1::RegisterResponse> responses;
  JobEffects fx;
  ASSERT_TRUE(m.Register(all, absl::UnixEpoch(), &responses, &fx).ok());
  for (int r = 0; r < n; ++r) {
    const int ranks[] = {r};
    const std::string keys[] = {responses[r].session_key()};
    ASSERT_TRUE(m.Attach(ranks, keys, false, std::make_shared<Sink>(), &fx).ok());
  }
  const int per_stage = layers / pp;
  for (int it = 0; it < iterations; ++it) {
    std::vector<dynmo::v1::IterationReport> reports(static_cast<size_t>(n));
    std::vector<UpstreamMessage> up;
    for (int r = 0; r < n; ++r) {
      reports[r].set_iteration(it);
      reports[r].set_probe_s(0.001 * probe_slow[r]);
      if (!exchange_s.empty()) reports[r].set_exchange_s(exchange_s[r]);
      const int stage = r / dp;
      for (int l = stage * per_stage; l < (stage + 1) * per_stage; ++l) {
        auto* s = reports[r].add_layers();
        s->set_layer(l);
        s->set_fwd_s(0.01 * layer_slow[r]);
        s->set_bwd_s(0.02 * layer_slow[r]);
      }
      up.push_back({r, &reports[r], nullptr});
    }
    JobEffects step;
    ASSERT_TRUE(m.OnUpstream(up, absl::UnixEpoch(), &step).ok());
  }
}

// Two stages of two replicas over 10 equal layers, fed 30 iterations;
// rank 3's probe says half speed, but the layers it shares with its
// replica (rank 2) run 1/0.3 slower there.
struct ReplicaJob {
  explicit ReplicaJob(bool overlaps) {
    JobOptions options;
    options.default_policy.trigger = Trigger{Trigger::Kind::kManual};
    options.speed.overlap.enabled = overlaps;
    dynmo::v1::RegisterRequest first = Reg(0);
    first.set_pipeline_size(2);
    first.set_data_parallel_size(2);
    first.set_num_layers(10);
    machine = std::make_unique<JobMachine>(first, options, &journal);
    FeedReplicas(*machine, 2, 2, {1, 1, 1, 2}, {1, 1, 1, 1 / 0.3}, 10, 30);
  }
  Journal journal;
  std::unique_ptr<JobMachine> machine;
};

// The layers win: rank 3 runs at 0.3, stage 1 at its slowest replica's
// speed, and the exact split for speeds {1, 0.3} puts 8 of 10 equal layers
// on stage 0 (max(8, 2 / 0.3) = 8 beats max(7, 3 / 0.3) = 10); the probe
// alone would have said 0,7,10.
TEST(JobMachineSpeedTest, TheLayersTheReplicasShareCorrectTheProbe) {
  ReplicaJob job(/*overlaps=*/true);
  JobMachine& m = *job.machine;
  EXPECT_NEAR(m.speeds().speed(3), 0.3, 0.3 * 0.01);
  EXPECT_GT(m.speeds().speed(2), 0.99);
  // The layers run (1 / 0.3) / 2 = 1.67x slower than rank 3's probe says.
  EXPECT_NEAR(m.speeds().correction(3) / m.speeds().correction(2), 1 / (0.3 * 2), 0.02);
  JobEffects decide;
  auto r = m.Rebalance(absl::UnixEpoch(), &decide);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->issued()) << r->detail();
  EXPECT_EQ(Ints(r->plan().boundaries()), (std::vector<int>{0, 8, 10}));
}

// With the layers' evidence turned off the probe's 0.5 stands, and stage
// 1's layers, measured 1/0.3 slower there, are priced 0.5 / 0.3 = 1.67
// times what they cost at speed 1.
TEST(JobMachineSpeedTest, WithoutOverlapsTheProbeAloneDecides) {
  ReplicaJob job(/*overlaps=*/false);
  EXPECT_NEAR(job.machine->speeds().speed(3), 0.5, 1e-9);
  EXPECT_EQ(job.machine->speeds().correction(3), 1.0);
}

// Exchanges run on the rank's device too. Two one-rank stages over 10
// equal layers (0.03 s a micro-batch each at speed 1), rank 1 at half
// speed. Rank 0 spends 0.36 s an iteration exchanging (4 micro-batches:
// 0.09 each, 3 layers' worth), rank 1 more (it waits). Priced at the least
// (0.09 at speed 1) on both stages, 0,7,10 costs max(10, 12) = 12 layers'
// worth and 0,8,10 max(11, 10) = 11: 0,8,10 (without exchanges, 0,7,10).
TEST(JobMachineSpeedTest, ExchangesArePricedAtEachStagesSpeed) {
  JobOptions options;
  options.default_policy.trigger = Trigger{Trigger::Kind::kManual};
  Journal journal;
  dynmo::v1::RegisterRequest first = Reg(0);
  first.set_pipeline_size(2);
  first.set_num_layers(10);
  JobMachine m(first, options, &journal);
  FeedReplicas(m, 2, 1, {1, 2}, {1, 2}, 10, 12, {0.36, 1.08});
  EXPECT_NEAR(m.speeds().speed(1), 0.5, 1e-9);
  JobEffects decide;
  auto r = m.Rebalance(absl::UnixEpoch(), &decide);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->issued()) << r->detail();
  EXPECT_EQ(Ints(r->plan().boundaries()), (std::vector<int>{0, 8, 10}));
}

TEST(JobMachineSpeedTest, AProbeOrExchangeTimeThatIsNotFiniteIsRefused) {
  JobOptions options;
  Journal journal;
  JobMachine m(Reg(0), options, &journal);
  std::vector<dynmo::v1::RegisterRequest> regs = {Reg(0)};
  std::vector<const dynmo::v1::RegisterRequest*> all = {&regs[0]};
  std::vector<dynmo::v1::RegisterResponse> responses;
  JobEffects fx;
  ASSERT_TRUE(m.Register(all, absl::UnixEpoch(), &responses, &fx).ok());
  dynmo::v1::IterationReport bad_probe;
  bad_probe.set_iteration(1);
  bad_probe.set_probe_s(-1);
  dynmo::v1::IterationReport bad_exchange;
  bad_exchange.set_iteration(1);
  bad_exchange.set_exchange_s(std::nan(""));
  for (const auto& [report, field] :
       {std::pair{&bad_probe, "probe_s"}, std::pair{&bad_exchange, "exchange_s"}}) {
    const UpstreamMessage up[] = {{0, report, nullptr}};
    absl::Status s = m.OnUpstream(up, absl::UnixEpoch(), &fx);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(std::string(s.message()).find(field), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace dynmo::service

namespace dynmo::service {
namespace {

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
  std::vector<dynmo::v1::RegisterRequest> regs = {reg(0), reg(1)};
  std::vector<const dynmo::v1::RegisterRequest*> all = {&regs[0], &regs[1]};
  std::vector<dynmo::v1::RegisterResponse> responses;
  const absl::Time t0 = absl::FromUnixSeconds(1'000'000);
  JobEffects fx;
  if (!m.Register(all, t0, &responses, &fx).ok()) return -2;
  std::vector<std::shared_ptr<Sink>> sinks;
  for (int r = 0; r < kStages; ++r) {
    sinks.push_back(std::make_shared<Sink>());
    const int ranks[] = {r};
    const std::string keys[] = {responses[r].session_key()};
    if (!m.Attach(ranks, keys, false, sinks[r], &fx).ok()) return -2;
  }
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
