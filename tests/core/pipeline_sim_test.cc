#include "core/pipeline_sim.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace dynmo::core {
namespace {

constexpr double kEps = 1e-9;
constexpr Schedule kAllSchedules[] = {Schedule::kGPipe, Schedule::k1F1B,
                                      Schedule::kZBH1};

struct PassTimes {
  double f, b, w;
};

// Pass-time mixes with W <= B: equal passes, the paper's typical B > F > W,
// a heavy forward, a free weight gradient, and W > F.
const std::vector<PassTimes>& Mixes() {
  static const auto* mixes = new std::vector<PassTimes>{
      {1, 1, 1},     {1, 1.5, 0.5}, {2, 1, 0.5}, {3, 1, 1},
      {1, 1, 0},     {0.5, 2, 1},   {1, 2, 2},   {0.25, 1, 0.75},
      {0.01, 0.02, 0.01}};
  return *mixes;
}

SimConfig Config(Schedule schedule, int p, int m, PassTimes t,
                 double transfer_s = 0) {
  SimConfig c;
  c.schedule = schedule;
  c.microbatches = m;
  c.stages.assign(p, StagePassTimes{t.f, t.b, t.w});
  c.transfer_s = transfer_s;
  return c;
}

SimResult MustSimulate(const SimConfig& config) {
  absl::StatusOr<SimResult> r = SimulatePipeline(config);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : SimResult{};
}

std::string Case(int p, int m, PassTimes t, double c = 0) {
  return "p=" + std::to_string(p) + " m=" + std::to_string(m) +
         " F=" + std::to_string(t.f) + " B=" + std::to_string(t.b) +
         " W=" + std::to_string(t.w) + " c=" + std::to_string(c);
}

TEST(ScheduleNameTest, ParseScheduleRoundTripsEveryName) {
  for (Schedule s : kAllSchedules) {
    absl::StatusOr<Schedule> parsed = ParseSchedule(ScheduleName(s));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, s);
  }
  EXPECT_EQ(ScheduleName(Schedule::kGPipe), "gpipe");
  EXPECT_EQ(ScheduleName(Schedule::k1F1B), "1f1b");
  EXPECT_EQ(ScheduleName(Schedule::kZBH1), "zb-h1");
}

TEST(ScheduleNameTest, ParseScheduleRejectsUnknownName) {
  for (const char* name : {"", "zb-h2", "1F1B", "pipedream"}) {
    absl::StatusOr<Schedule> parsed = ParseSchedule(name);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << name;
  }
  EXPECT_NE(ParseSchedule("zb-h2").status().message().find("zb-h2"),
            std::string::npos);
}

TEST(PipelineSimTest, GPipeMatchesClosedForm) {
  for (int p = 1; p <= 6; ++p) {
    for (int m = 1; m <= 12; ++m) {
      for (PassTimes t : Mixes()) {
        const SimResult r = MustSimulate(Config(Schedule::kGPipe, p, m, t));
        EXPECT_NEAR(r.iteration_time_s, (m + p - 1) * (t.f + t.b + t.w), kEps)
            << Case(p, m, t);
      }
    }
  }
}

TEST(PipelineSimTest, OneFOneBMatchesClosedForm) {
  for (int p = 1; p <= 6; ++p) {
    for (int m = 1; m <= 12; ++m) {
      for (PassTimes t : Mixes()) {
        const SimResult r = MustSimulate(Config(Schedule::k1F1B, p, m, t));
        EXPECT_NEAR(r.iteration_time_s, (m + p - 1) * (t.f + t.b + t.w), kEps)
            << Case(p, m, t);
      }
    }
  }
}

// Qi et al. 2024: ZB-H1 shrinks 1F1B's bubble from (p-1)(F+B+W) to
// (p-1)(F+B-W), for m >= p.
TEST(PipelineSimTest, ZBH1MatchesPaperClosedFormWhenWeightGradAtMostForward) {
  for (int p = 1; p <= 7; ++p) {
    for (int m = p; m <= p + 10; ++m) {
      for (PassTimes t : Mixes()) {
        if (t.w > t.f) continue;
        const SimResult r = MustSimulate(Config(Schedule::kZBH1, p, m, t));
        EXPECT_NEAR(r.iteration_time_s,
                    m * (t.f + t.b + t.w) + (p - 1) * (t.f + t.b - t.w), kEps)
            << Case(p, m, t);
      }
    }
  }
}

// The paper's form cannot hold when W > F under 1F1B's memory: stage 0 may
// hold only p forwards before its first backward, which returns no earlier
// than pF + (p-1)B, so stage 0 idles at least (p-1)B. ZB-H1 reaches exactly
// that bound.
TEST(PipelineSimTest, ZBH1IdlesFirstStageOnlyForFirstGradientWhenWExceedsF) {
  for (int p = 1; p <= 7; ++p) {
    for (int m = p; m <= p + 10; ++m) {
      for (PassTimes t : Mixes()) {
        if (t.w <= t.f) continue;
        const SimResult r = MustSimulate(Config(Schedule::kZBH1, p, m, t));
        EXPECT_NEAR(r.iteration_time_s, m * (t.f + t.b + t.w) + (p - 1) * t.b,
                    kEps)
            << Case(p, m, t);
      }
    }
  }
}

TEST(PipelineSimTest, ZBH1IsNeverSlowerThanOneFOneBForEqualStages) {
  for (int p = 1; p <= 7; ++p) {
    for (int m = 1; m <= 14; ++m) {
      for (PassTimes t : Mixes()) {
        const double zb =
            MustSimulate(Config(Schedule::kZBH1, p, m, t)).iteration_time_s;
        const double one =
            MustSimulate(Config(Schedule::k1F1B, p, m, t)).iteration_time_s;
        EXPECT_LE(zb, one + kEps) << Case(p, m, t);
      }
    }
  }
}

// Activations live from F until the weight gradient is done (W, or B when
// fused). 1F1B keeps p-s micro-batches on stage s; ZB-H1 may keep p on every
// stage, the peak of 1F1B's first stage, and no more.
TEST(PipelineSimTest, ZBH1KeepsOneFOneBPeakActivationCount) {
  const int p = 5;
  const int m = 12;
  for (Schedule schedule : {Schedule::k1F1B, Schedule::kZBH1}) {
    const SimResult r = MustSimulate(Config(schedule, p, m, {1, 1.5, 0.5}));
    const OpKind frees = schedule == Schedule::kZBH1 ? OpKind::kWeightGrad
                                                     : OpKind::kBackward;
    std::vector<int> live(p, 0), peak(p, 0);
    for (const SimOp& op : r.timeline) {  // sorted by (stage, start)
      if (op.kind == OpKind::kForward) ++live[op.stage];
      if (op.kind == frees) --live[op.stage];
      peak[op.stage] = std::max(peak[op.stage], live[op.stage]);
    }
    for (int s = 0; s < p; ++s) {
      EXPECT_EQ(peak[s], schedule == Schedule::kZBH1 ? p : p - s)
          << ScheduleName(schedule) << " stage " << s;
    }
  }
}

TEST(PipelineSimTest, OneFOneBBubbleRatioIsWarmupOverTotal) {
  for (int p = 1; p <= 6; ++p) {
    for (int m = 1; m <= 12; ++m) {
      const SimResult r =
          MustSimulate(Config(Schedule::k1F1B, p, m, {1, 1.5, 0.5}));
      EXPECT_NEAR(r.bubble_ratio, double(p - 1) / (m + p - 1), kEps)
          << "p=" << p << " m=" << m;
      for (int s = 0; s < p; ++s) {
        EXPECT_NEAR(r.stage_busy_s[s], m * 3.0, kEps);
        EXPECT_NEAR(r.stage_idle_s[s], (p - 1) * 3.0, kEps);
      }
    }
  }
}

// The first micro-batch's round trip crosses 2(p-1) links. After that,
// stage 0 keeps p micro-batches in flight, and each of their round trips
// again pays 2(p-1) hops, so the steady state adds 2(p-1)c per p
// micro-batches: floor((m-1)(p-1)/p) more hop pairs in all.
TEST(PipelineSimTest, TransferAddsTwoHopsPerRoundTripInOneFOneB) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 20; ++m) {
      for (PassTimes t : {PassTimes{1, 1, 1}, PassTimes{1, 3, 0.5},
                          PassTimes{2, 1, 0}}) {
        for (double c : {0.1, 0.7, 5.0}) {
          const SimResult r =
              MustSimulate(Config(Schedule::k1F1B, p, m, t, c));
          const int hop_pairs = (p - 1) + (m - 1) * (p - 1) / p;
          EXPECT_NEAR(r.iteration_time_s,
                      (m + p - 1) * (t.f + t.b + t.w) + 2 * hop_pairs * c,
                      1e-9 * (1 + r.iteration_time_s))
              << Case(p, m, t, c);
        }
      }
    }
  }
}

// GPipe streams all forwards, then all backwards: only the first forward and
// the last backward wait on a hop at every link.
TEST(PipelineSimTest, TransferAddsOneRoundTripInGPipe) {
  for (int p = 1; p <= 6; ++p) {
    for (int m = 1; m <= 10; ++m) {
      const PassTimes t{1, 1.5, 0.5};
      const double c = 0.3;
      const SimResult r = MustSimulate(Config(Schedule::kGPipe, p, m, t, c));
      EXPECT_NEAR(r.iteration_time_s,
                  (m + p - 1) * (t.f + t.b + t.w) + 2 * (p - 1) * c, 1e-9)
          << Case(p, m, t, c);
    }
  }
}

std::vector<StagePassTimes> RandomStages(std::mt19937* rng, int p) {
  std::uniform_real_distribution<double> time(0.1, 3.0);
  std::vector<StagePassTimes> stages(p);
  for (StagePassTimes& s : stages) {
    s.fwd_s = time(*rng);
    s.bwd_s = time(*rng);
    s.wgrad_s = std::uniform_real_distribution<double>(0, s.bwd_s)(*rng);
  }
  return stages;
}

TEST(PipelineSimTest, HeterogeneousStagesNeverBeatTheBusiestStage) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int p = 1 + trial % 6;
    const int m = 1 + (trial / 6) % 10;
    SimConfig c;
    c.microbatches = m;
    c.stages = RandomStages(&rng, p);
    c.transfer_s = trial % 3 == 0 ? 0.05 : 0;
    double busiest = 0;
    for (const StagePassTimes& s : c.stages) {
      busiest = std::max(busiest, m * (s.fwd_s + s.bwd_s + s.wgrad_s));
    }
    for (Schedule schedule : kAllSchedules) {
      c.schedule = schedule;
      const SimResult r = MustSimulate(c);
      EXPECT_GE(r.iteration_time_s, busiest - kEps)
          << ScheduleName(schedule) << " trial " << trial;
    }
  }
}

// Stage 2 is ten times slower than the rest, so it paces the pipeline.
// GPipe still fills and drains through every other stage; 1F1B's fast later
// stages return each gradient before stage 2 asks for it, so only the
// stages in front of it add their fill and drain.
TEST(PipelineSimTest, SlowestStagePacesGPipeAndOneFOneB) {
  SimConfig c;
  c.microbatches = 8;
  c.stages = {{1, 1, 1}, {1, 2, 1}, {10, 20, 10}, {1, 1, 0.5}};
  const double slow = 8 * 40.0;
  c.schedule = Schedule::kGPipe;
  EXPECT_NEAR(MustSimulate(c).iteration_time_s, slow + 3 + 4 + 2.5, kEps);
  c.schedule = Schedule::k1F1B;
  EXPECT_NEAR(MustSimulate(c).iteration_time_s, slow + 3 + 4, kEps);
  c.schedule = Schedule::kZBH1;
  const SimResult zb = MustSimulate(c);
  EXPECT_GE(zb.iteration_time_s, slow);
  EXPECT_LE(zb.iteration_time_s, slow + 3 + 4);
  EXPECT_NEAR(zb.stage_busy_s[2], slow, kEps);
}

// Checks the timeline against the schedule's rules: each pass of each
// micro-batch runs once per stage, after its input has arrived, with no two
// ops overlapping on a stage, and busy + idle accounting for T.
void ExpectConsistentTimeline(const SimConfig& c, const SimResult& r,
                              const std::string& what) {
  const int p = static_cast<int>(c.stages.size());
  const int m = c.microbatches;
  const bool split = c.schedule == Schedule::kZBH1;
  std::map<std::tuple<int, int, int>, const SimOp*> by_key;
  for (const SimOp& op : r.timeline) {
    auto key = std::make_tuple(static_cast<int>(op.kind), op.stage,
                               op.microbatch);
    EXPECT_TRUE(by_key.emplace(key, &op).second) << what << " duplicate op";
  }
  ASSERT_EQ(r.timeline.size(), static_cast<size_t>(p * m * (split ? 3 : 2)))
      << what;
  auto end_of = [&](OpKind kind, int s, int mb) {
    auto it = by_key.find({static_cast<int>(kind), s, mb});
    EXPECT_NE(it, by_key.end()) << what;
    return it == by_key.end() ? 0.0 : it->second->end_s;
  };
  for (const SimOp& op : r.timeline) {
    ASSERT_GE(op.microbatch, 0);
    ASSERT_LT(op.microbatch, m);
    double ready = 0;
    if (op.kind == OpKind::kForward && op.stage > 0) {
      ready = end_of(OpKind::kForward, op.stage - 1, op.microbatch) +
              c.transfer_s;
    } else if (op.kind == OpKind::kBackward) {
      ready = op.stage == p - 1
                  ? end_of(OpKind::kForward, op.stage, op.microbatch)
                  : end_of(OpKind::kBackward, op.stage + 1, op.microbatch) +
                        c.transfer_s;
    } else if (op.kind == OpKind::kWeightGrad) {
      EXPECT_TRUE(split) << what << " W op in a fused schedule";
      ready = end_of(OpKind::kBackward, op.stage, op.microbatch);
    }
    EXPECT_GE(op.start_s, ready - kEps) << what;
    EXPECT_LE(op.end_s, r.iteration_time_s + kEps) << what;
  }
  for (size_t i = 1; i < r.timeline.size(); ++i) {
    const SimOp& a = r.timeline[i - 1];
    const SimOp& b = r.timeline[i];
    ASSERT_TRUE(a.stage < b.stage ||
                (a.stage == b.stage && a.start_s <= b.start_s))
        << what << " timeline not sorted by (stage, start)";
    if (a.stage == b.stage) {
      EXPECT_GE(b.start_s, a.end_s - kEps) << what;
    }
  }
  for (int s = 0; s < p; ++s) {
    EXPECT_NEAR(r.stage_busy_s[s] + r.stage_idle_s[s], r.iteration_time_s,
                1e-9 * (1 + r.iteration_time_s))
        << what;
  }
}

TEST(PipelineSimTest, EveryOpRunsOnceAfterItsInputs) {
  std::mt19937 rng(11);
  for (Schedule schedule : kAllSchedules) {
    for (int p = 1; p <= 6; ++p) {
      for (int m = 1; m <= 9; ++m) {
        SimConfig c;
        c.schedule = schedule;
        c.microbatches = m;
        c.stages = RandomStages(&rng, p);
        c.transfer_s = (p + m) % 2 == 0 ? 0.2 : 0;
        const SimResult r = MustSimulate(c);
        ExpectConsistentTimeline(
            c, r, ScheduleName(schedule) + " p=" + std::to_string(p) +
                      " m=" + std::to_string(m));
      }
    }
  }
}

TEST(PipelineSimTest, ZeroTimesGiveZeroIterationAndZeroBubble) {
  for (Schedule schedule : kAllSchedules) {
    const SimResult r = MustSimulate(Config(schedule, 3, 4, {0, 0, 0}));
    EXPECT_EQ(r.iteration_time_s, 0);
    EXPECT_EQ(r.bubble_ratio, 0);
  }
}

TEST(PipelineSimTest, RejectsInvalidConfigs) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<SimConfig> bad;
  bad.push_back(Config(Schedule::k1F1B, 0, 4, {1, 1, 1}));
  bad.push_back(Config(Schedule::k1F1B, 2, 0, {1, 1, 1}));
  bad.push_back(Config(Schedule::k1F1B, 2, -3, {1, 1, 1}));
  bad.push_back(Config(Schedule::kGPipe, 2, 4, {-1, 1, 1}));
  bad.push_back(Config(Schedule::kZBH1, 2, 4, {1, nan, 1}));
  bad.push_back(Config(Schedule::kZBH1, 2, 4, {1, 1, inf}));
  bad.push_back(Config(Schedule::k1F1B, 2, 4, {1, 1, 1}, -0.1));
  bad.push_back(Config(Schedule::k1F1B, 2, 4, {1, 1, 1}, nan));
  bad.push_back(Config(Schedule::k1F1B, 2, 4, {1, 1, 1}, inf));
  for (size_t i = 0; i < bad.size(); ++i) {
    absl::StatusOr<SimResult> r = SimulatePipeline(bad[i]);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << "case " << i;
    EXPECT_FALSE(r.status().message().empty()) << "case " << i;
  }
}

TEST(PipelineSimTest, ErrorMessageNamesTheBadStage) {
  SimConfig c = Config(Schedule::k1F1B, 3, 4, {1, 1, 1});
  c.stages[2].bwd_s = -2;
  absl::StatusOr<SimResult> r = SimulatePipeline(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("stage 2"), std::string::npos)
      << r.status();
}

int CountOf(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

TEST(GanttSvgTest, DrawsOneBoxPerOpAndOneRowPerStage) {
  for (Schedule schedule : kAllSchedules) {
    const SimResult r = MustSimulate(Config(schedule, 4, 6, {1, 1.5, 0.5}));
    const std::string svg = RenderGanttSvg(r, "four stages");
    EXPECT_EQ(CountOf(svg, "<rect class=\"op\""),
              static_cast<int>(r.timeline.size()));
    EXPECT_EQ(CountOf(svg, "<rect class=\"row\""), 4);
    for (int s = 0; s < 4; ++s) {
      EXPECT_NE(svg.find(">stage " + std::to_string(s) + "<"),
                std::string::npos);
    }
  }
}

TEST(GanttSvgTest, IsAStandaloneSvgDocumentWithTitleAxisAndLegend) {
  const SimResult r =
      MustSimulate(Config(Schedule::k1F1B, 2, 2, {0.001, 0.002, 0.001}));
  const std::string svg = RenderGanttSvg(r, "tiny");
  EXPECT_TRUE(svg.rfind("<?xml", 0) == 0 || svg.rfind("<svg", 0) == 0);
  EXPECT_NE(svg.find("xmlns=\"http://www.w3.org/2000/svg\""),
            std::string::npos);
  EXPECT_EQ(CountOf(svg, "<svg"), 1);
  EXPECT_EQ(CountOf(svg, "</svg>"), 1);
  EXPECT_NE(svg.find("tiny (iteration 12 ms, bubble 33.3%)"),
            std::string::npos)
      << svg.substr(0, 600);
  EXPECT_NE(svg.find(">0 ms<"), std::string::npos);  // sub-second axis in ms
  EXPECT_NE(svg.find("F forward"), std::string::npos);
  EXPECT_NE(svg.find("W weight gradient"), std::string::npos);
}

TEST(GanttSvgTest, EscapesTheTitle) {
  const SimResult r = MustSimulate(Config(Schedule::kZBH1, 2, 2, {1, 1, 1}));
  const std::string svg = RenderGanttSvg(r, "a<b & \"c\"");
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
  EXPECT_NE(svg.find("a&lt;b &amp; &quot;c&quot;"), std::string::npos);
  // Every '&' starts an entity, so the document stays well-formed XML.
  for (size_t at = svg.find('&'); at != std::string::npos;
       at = svg.find('&', at + 1)) {
    const size_t semi = svg.find(';', at);
    ASSERT_NE(semi, std::string::npos);
    EXPECT_LE(semi - at, 6u) << svg.substr(at, 10);
  }
}

TEST(GanttSvgTest, LabelsSecondsForIterationsOfASecondOrMore) {
  const SimResult r = MustSimulate(Config(Schedule::kGPipe, 2, 3, {1, 1, 1}));
  const std::string svg = RenderGanttSvg(r, "slow");
  EXPECT_NE(svg.find("(iteration 12 s,"), std::string::npos);
  EXPECT_NE(svg.find(">0 s<"), std::string::npos);
}

}  // namespace
}  // namespace dynmo::core
