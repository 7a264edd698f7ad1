// JobMachine with ranks of unequal speed: the split, re-packing and the
// exchanges priced at each rank's measured speed (core/rank_speed.h).
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/job/job_machine.h"
#include "coordinator/job/job_speeds.h"
#include "coordinator/job/rank_roster.h"
#include "gtest/gtest.h"
#include "tests/service/job_machine_helpers.h"

namespace dynmo::service {
namespace {

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
  EXPECT_EQ(RegisterAndAttach(m, regs, absl::UnixEpoch()).size(), static_cast<size_t>(n));
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

// A two-rank auto job of 10 equal layers, rank 1 at half speed, reporting
// every iteration with the probe times `probe(rank, iteration)` gives
// (<= 0: no probe that iteration): when the first rank_speed event came,
// whether the trigger said it waited for a speed, and the first plan.
struct FirstPlan {
  int64_t speed_at = -1;
  bool held = false;
  int64_t issued_at = -1;
  std::vector<int> issued;
};
FirstPlan RunToTheFirstPlan(const std::function<double(int, int)>& probe) {
  JobOptions options;
  options.default_policy.trigger = Trigger{Trigger::Kind::kAuto};
  options.plan_lead_iterations = 2;
  Journal journal;
  dynmo::v1::RegisterRequest first = Reg(0);
  first.set_pipeline_size(2);
  first.set_num_layers(10);
  JobMachine m(first, options, &journal);
  std::vector<dynmo::v1::RegisterRequest> regs;
  for (int r = 0; r < 2; ++r) {
    regs.push_back(Reg(r));
    regs.back().set_pipeline_size(2);
    regs.back().set_num_layers(10);
  }
  FirstPlan out;
  if (RegisterAndAttach(m, regs, absl::UnixEpoch()).size() != 2u) return out;
  const std::vector<double> slow = {1.0, 2.0};
  for (int it = 0; it < 40 && out.issued_at < 0; ++it) {
    std::vector<dynmo::v1::IterationReport> reports(2);
    std::vector<UpstreamMessage> up;
    for (int r = 0; r < 2; ++r) {
      reports[r].set_iteration(it);
      if (probe(r, it) > 0) reports[r].set_probe_s(probe(r, it));
      for (int l = r * 5; l < (r + 1) * 5; ++l) {
        auto* s = reports[r].add_layers();
        s->set_layer(l);
        s->set_fwd_s(0.01 * slow[r]);
        s->set_bwd_s(0.02 * slow[r]);
      }
      up.push_back({r, &reports[r], nullptr});
    }
    JobEffects fx;
    if (!m.OnUpstream(up, absl::UnixEpoch(), &fx).ok()) return out;
    m.Tick(absl::UnixEpoch(), &fx);
    for (const JobEvent& e : fx.events) {
      if (e.name == "rank_speed" && out.speed_at < 0) out.speed_at = it;
    }
    out.held = out.held || m.Status().note().find("still being probed") != std::string::npos;
    for (const JobEffects::Send& send : fx.sends) {
      if (out.issued_at >= 0 || !send.message->has_prepare()) continue;
      out.issued_at = it;
      out.issued.assign(send.message->prepare().boundaries().begin(),
                        send.message->prepare().boundaries().end());
    }
  }
  return out;
}

// Under the auto trigger a rank that has begun probing holds the first plan
// until its speed is known: a straggler at half speed, probed on its first
// five iterations (core::ProbeCadenceOptions::start_probes), gets the
// exact split for its speed as its first plan (0,7,10), not the one its
// layers' times priced at speed 1 call for (0,6,10) and a second plan later.
TEST(JobMachineSpeedTest, AutoWaitsForAProbingRanksSpeedBeforeItsFirstPlan) {
  const FirstPlan p = RunToTheFirstPlan([](int r, int it) {
    return it < 5 ? 0.001 * (r == 1 ? 2.0 : 1.0) : 0.0;  // the start's probes
  });
  EXPECT_EQ(p.speed_at, 4) << "published on the fifth probe";
  EXPECT_TRUE(p.held) << "the trigger waited for the probes";
  ASSERT_GE(p.issued_at, p.speed_at);
  EXPECT_EQ(p.issued, (std::vector<int>{0, 7, 10}));
}

// The same straggler whose five start probes scatter too much to publish
// its speed (core::RankSpeeds::in_doubt): auto goes on waiting, through
// the probes every fifth iteration, until the speed is published, and the
// first plan is still the split for it, where it used to be priced at
// speed 1 (0,6,10) as soon as the fifth probe was in.
TEST(JobMachineSpeedTest, AutoWaitsForAStragglerWhoseStartProbesScattered) {
  const FirstPlan p = RunToTheFirstPlan([](int r, int it) {
    static const double kScattered[] = {1.0, 3.0, 1.2, 2.8, 1.0};  // mean 1.8
    if (r == 0) return it < 5 || it % 5 == 0 ? 0.001 : 0.0;
    if (it < 5) return 0.001 * kScattered[it];
    return it % 5 == 0 ? 0.002 : 0.0;
  });
  EXPECT_GT(p.speed_at, 4) << "not published by the start's probes";
  EXPECT_TRUE(p.held);
  ASSERT_GE(p.issued_at, p.speed_at) << "no plan before the speed";
  EXPECT_EQ(p.issued, (std::vector<int>{0, 7, 10}));
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
  ASSERT_EQ(RegisterAndAttach(m, regs, absl::UnixEpoch()).size(), static_cast<size_t>(n));
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

// A rank's exchanges around a plan's switch carry the migration and the new
// layout's first waits: they stay out of the estimate the next plan prices
// (the main job read 7-9 ms a micro-batch there against 1-1.4 ms after).
TEST(JobMachineSpeedTest, ExchangesAroundASwitchAreLeftOut) {
  RankRoster roster(JobShape{"m", 2, 1, 10, ""});
  roster.Register(Reg(0));
  roster.Register(Reg(1));
  JobLayout layout = StartingLayout(4, "1f1b", {0, 1}, {0, 5, 10}, 2, 10);
  JobSpeeds speeds("m", 2, 10, core::RankSpeedOptions{}, /*smoothing=*/0.5);
  auto report = [&](int rank, int64_t it, double exchange_s, bool settled) {
    dynmo::v1::IterationReport r;
    r.set_iteration(it);
    r.set_exchange_s(exchange_s);
    JobEffects fx;
    speeds.OnReport(rank, r, {}, /*microbatches=*/4, settled, &fx);
  };
  report(0, 0, 0.4, true);
  report(1, 0, 0.8, true);
  EXPECT_DOUBLE_EQ(speeds.Exchange(roster, layout), 0.1) << "the least, per micro-batch";
  report(0, 1, 4.0, /*settled=*/false);
  report(1, 1, 4.0, false);
  EXPECT_DOUBLE_EQ(speeds.Exchange(roster, layout), 0.1) << "the switch's left out";
  report(0, 2, 0.8, true);
  EXPECT_DOUBLE_EQ(speeds.Exchange(roster, layout), 0.15) << "smoothed in after it";
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
