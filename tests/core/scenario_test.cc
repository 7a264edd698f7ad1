#include "core/scenario.h"

#include <algorithm>
#include <iostream>
#include <numeric>
#include <vector>

#include "core/measures.h"
#include "core/partition.h"
#include "core/scenario_random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dynmo::core {
namespace {

using ::testing::HasSubstr;

constexpr Scenario kAll[] = {
    Scenario::kPruning,   Scenario::kFreezing, Scenario::kSparseAttention,
    Scenario::kEarlyExit, Scenario::kMoE,      Scenario::kMoD};

Trace Generate(Scenario s, uint64_t seed = 1, double noise = 0.01) {
  ScenarioConfig c;
  c.scenario = s;
  c.seed = seed;
  c.timing_noise = noise;
  absl::StatusOr<Trace> t = GenerateScenario(c);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

// Without jitter, so each model's effect can be read exactly.
Trace Exact(Scenario s) { return Generate(s, 1, 0.0); }

double Time(const TraceLayer& l) { return l.fwd_s + l.bwd_s + l.wgrad_s; }

double TotalTime(const TraceRecord& r) {
  double t = 0;
  for (const TraceLayer& l : r.layers) t += Time(l);
  return t;
}

int64_t TotalBytes(const TraceRecord& r) {
  int64_t b = 0;
  for (const TraceLayer& l : r.layers) b += l.mem_bytes;
  return b;
}

double UniformImbalance(const TraceRecord& r, int stages) {
  PipelineModel m;
  m.layers = LayerCostsOf(r);
  m.stages.assign(stages, StageSpec{});
  return Imbalance(StageLoads(m, PartitionUniform(m.layers.size(), stages)));
}

// Mean of f over the first or last `share` of the trace.
template <typename F>
double MeanOver(const Trace& t, bool last, double share, F f) {
  const int n = std::max<int>(1, static_cast<int>(t.size() * share));
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += f(t[last ? t.size() - 1 - i : i]);
  return sum / n;
}

const ScenarioConfig kDefaults;
const double kDenseLayer =
    kDefaults.fwd_s + kDefaults.bwd_s + kDefaults.wgrad_s;
const int64_t kDenseBytes = kDefaults.layer_params * kDefaults.bytes_per_param;

TEST(ScenarioTest, NamesRoundTrip) {
  for (Scenario s : kAll) {
    absl::StatusOr<Scenario> parsed = ParseScenario(ScenarioName(s));
    ASSERT_TRUE(parsed.ok()) << ScenarioName(s);
    EXPECT_EQ(*parsed, s);
  }
  EXPECT_EQ(ScenarioName(Scenario::kSparseAttention), "sparse-attention");
  EXPECT_EQ(ScenarioName(Scenario::kEarlyExit), "early-exit");
}

TEST(ScenarioTest, UnknownNameListsTheKnownOnes) {
  absl::StatusOr<Scenario> s = ParseScenario("dropout");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("early-exit"));
}

TEST(ScenarioTest, InvalidConfigsAreRejected) {
  ScenarioConfig c;
  c.layers = 0;
  EXPECT_THAT(GenerateScenario(c).status().message(), HasSubstr("layers"));
  c = ScenarioConfig();
  c.iterations = 0;
  EXPECT_THAT(GenerateScenario(c).status().message(), HasSubstr("iterations"));
  c = ScenarioConfig();
  c.bwd_s = -1;
  EXPECT_FALSE(GenerateScenario(c).ok());
  c = ScenarioConfig();
  c.attention_share = 1.5;
  EXPECT_FALSE(GenerateScenario(c).ok());
}

TEST(ScenarioTest, EveryScenarioGivesAValidTraceOfTheRequestedShape) {
  for (Scenario s : kAll) {
    ScenarioConfig c;
    c.scenario = s;
    c.layers = 10;
    c.iterations = 7;
    absl::StatusOr<Trace> t = GenerateScenario(c);
    ASSERT_TRUE(t.ok()) << ScenarioName(s) << ": " << t.status();
    EXPECT_TRUE(ValidateTrace(*t).ok());
    ASSERT_EQ(t->size(), 7u);
    EXPECT_EQ(t->front().layers.size(), 10u);
    EXPECT_EQ(t->back().iter, 6);
  }
}

TEST(ScenarioTest, TinyTracesWork) {
  for (Scenario s : kAll) {
    ScenarioConfig c;
    c.scenario = s;
    c.layers = 1;
    c.iterations = 1;
    absl::StatusOr<Trace> t = GenerateScenario(c);
    ASSERT_TRUE(t.ok()) << ScenarioName(s);
    EXPECT_TRUE(ValidateTrace(*t).ok());
  }
}

TEST(ScenarioTest, SameSeedGivesTheSameTraceBitForBit) {
  for (Scenario s : kAll) {
    Trace a = Generate(s, 42), b = Generate(s, 42);
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) {
      for (size_t i = 0; i < a[k].layers.size(); ++i) {
        const TraceLayer &x = a[k].layers[i], &y = b[k].layers[i];
        ASSERT_EQ(x.fwd_s, y.fwd_s) << ScenarioName(s) << " k=" << k;
        ASSERT_EQ(x.bwd_s, y.bwd_s);
        ASSERT_EQ(x.wgrad_s, y.wgrad_s);
        ASSERT_EQ(x.mem_bytes, y.mem_bytes);
      }
    }
  }
}

TEST(ScenarioTest, DifferentSeedsGiveDifferentTraces) {
  for (Scenario s : kAll) {
    Trace a = Generate(s, 1), b = Generate(s, 2);
    EXPECT_NE(a.back().layers[5].fwd_s, b.back().layers[5].fwd_s)
        << ScenarioName(s);
  }
}

// The generator's randomness must not depend on the standard library's
// distributions: these values follow from mt19937_64's standardised output.
TEST(ScenarioTest, RandomStreamsArePinned) {
  ScenarioRandom r(1, 2);
  EXPECT_EQ(r.Uniform(), 0.10919483479283099);
  EXPECT_EQ(r.Uniform(), 0.31839371870197075);
  EXPECT_NEAR(r.Normal(), -0.71827770970774163, 1e-15);
  ScenarioRandom other_stream(1, 3);
  EXPECT_NE(other_stream.Uniform(), 0.10919483479283099);
}

TEST(ScenarioTest, UniformDrawsStayInTheUnitInterval) {
  ScenarioRandom r(7, 1);
  for (int i = 0; i < 10000; ++i) {
    const double u = r.Uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

TEST(ScenarioTest, ImbalanceUnderUniformPartitioningRises) {
  for (Scenario s : kAll) {
    // MoD's routed and full blocks alternate, so stages with an even number
    // of layers hold equal shares of each and its drift cancels; what
    // uniform partitioning cannot see is the mix in stages of odd size, as
    // in 48 layers over 16 stages.
    const int stages = s == Scenario::kMoD ? 16 : 4;
    Trace t = Generate(s);
    auto imbalance = [&](const TraceRecord& r) {
      return UniformImbalance(r, stages);
    };
    const double early = MeanOver(t, false, 0.01, imbalance);
    const double late = MeanOver(t, true, 0.1, imbalance);
    std::cout << ScenarioName(s) << " imbalance " << early << " -> " << late
              << "\n";
    EXPECT_LT(early, 0.06) << ScenarioName(s);
    EXPECT_GT(late, 2 * early) << ScenarioName(s);
    EXPECT_GT(late, early + 0.03) << ScenarioName(s);
  }
}

TEST(ScenarioTest, PruningShrinksWorkAndMemoryUnevenly) {
  Trace t = Exact(Scenario::kPruning);
  EXPECT_NEAR(TotalTime(t.front()), 48 * kDenseLayer, 1e-9);
  EXPECT_LT(TotalTime(t.back()), 0.6 * TotalTime(t.front()));
  // CSR storage: 90% sparsity leaves well under a quarter of the bytes.
  EXPECT_LT(TotalBytes(t.back()), TotalBytes(t.front()) / 4);
  // Total work never grows: pruned weights stay pruned.
  for (size_t k = 1; k < t.size(); ++k) {
    EXPECT_LE(TotalTime(t[k]), TotalTime(t[k - 1]) + 1e-12) << "k=" << k;
  }
  // Global magnitude pruning prunes layers unevenly.
  std::vector<double> times;
  for (const TraceLayer& l : t.back().layers) times.push_back(Time(l));
  auto [lo, hi] = std::minmax_element(times.begin(), times.end());
  EXPECT_GT(*hi / *lo, 1.5);
}

TEST(ScenarioTest, LightPruningSavesNoTime) {
  // The first cubic steps reach 24% sparsity, far above where an
  // unstructured sparse kernel beats dense GEMM: every layer still runs
  // dense, at dense cost and size.
  Trace t = Exact(Scenario::kPruning);
  const TraceRecord& after_first_step = t[34];
  for (const TraceLayer& l : after_first_step.layers) {
    EXPECT_DOUBLE_EQ(Time(l), kDenseLayer);
    EXPECT_EQ(l.mem_bytes, kDenseBytes);
  }
}

TEST(ScenarioTest, FreezingGrowsAFrozenPrefixThatSkipsTheBackward) {
  Trace t = Exact(Scenario::kFreezing);
  auto prefix = [](const TraceRecord& r) {
    int n = 0;
    while (n < static_cast<int>(r.layers.size()) && r.layers[n].wgrad_s == 0) {
      ++n;
    }
    return n;
  };
  EXPECT_EQ(prefix(t.front()), 0);
  for (size_t k = 1; k < t.size(); ++k) {
    EXPECT_GE(prefix(t[k]), prefix(t[k - 1])) << "k=" << k;
  }
  EXPECT_GE(prefix(t.back()), 30);
  // The head-side quarter keeps training.
  EXPECT_LE(prefix(t.back()), 36);
  EXPECT_GT(t.back().layers[47].wgrad_s, 0);
  for (const TraceRecord& r : t) {
    const int p = prefix(r);
    for (int i = 0; i < p; ++i) {
      EXPECT_EQ(r.layers[i].bwd_s, 0);
      EXPECT_GT(r.layers[i].fwd_s, 0);
      EXPECT_LT(r.layers[i].mem_bytes, kDenseBytes / 4);  // no grads, no Adam
    }
    // Nothing before the first trainable layer wants its input gradient.
    if (p > 0) {
      EXPECT_EQ(r.layers[p].bwd_s, 0);
    }
  }
}

TEST(ScenarioTest, FrozenLayerBehindATrainableOneStillPassesItsGradient) {
  Trace t = Exact(Scenario::kFreezing);
  int seen = 0;
  for (const TraceRecord& r : t) {
    bool trainable_before = false;
    for (const TraceLayer& l : r.layers) {
      if (l.wgrad_s > 0) {
        trainable_before = true;
      } else if (trainable_before) {
        EXPECT_GT(l.bwd_s, 0);
        ++seen;
      }
    }
  }
  EXPECT_GT(seen, 0) << "the jittered freeze order should freeze some layer "
                        "before the one in front of it";
}

TEST(ScenarioTest, SparseAttentionChangesOnlyTheAttentionCore) {
  Trace t = Exact(Scenario::kSparseAttention);
  for (const TraceRecord& r : {t.front(), t[100], t.back()}) {
    for (const TraceLayer& l : r.layers) {
      EXPECT_DOUBLE_EQ(l.wgrad_s, kDefaults.wgrad_s);  // no weights in QK^T
      EXPECT_LT(l.fwd_s, kDefaults.fwd_s);
      EXPECT_GT(l.fwd_s, (1 - kDefaults.attention_share) * kDefaults.fwd_s);
      EXPECT_EQ(l.mem_bytes, kDenseBytes);
    }
  }
  // Deeper layers end sparser, and the sparsity moves every iteration.
  auto depth_half = [&](const TraceRecord& r, bool deep) {
    double s = 0;
    for (int i = deep ? 24 : 0; i < (deep ? 48 : 24); ++i)
      s += Time(r.layers[i]);
    return s;
  };
  EXPECT_LT(depth_half(t.back(), true), depth_half(t.back(), false));
  EXPECT_NE(t[50].layers[10].fwd_s, t[51].layers[10].fwd_s);
}

TEST(ScenarioTest, EarlyExitMakesDeeperLayersCheaperAsTrainingGoesOn) {
  Trace t = Exact(Scenario::kEarlyExit);
  for (const TraceLayer& l : t.front().layers) {
    EXPECT_DOUBLE_EQ(Time(l), kDenseLayer);  // nobody exits yet
  }
  const TraceRecord& last = t.back();
  EXPECT_DOUBLE_EQ(Time(last.layers[0]), kDenseLayer);  // all tokens enter
  for (size_t i = 1; i < last.layers.size(); ++i) {
    EXPECT_LE(Time(last.layers[i]), Time(last.layers[i - 1]));
  }
  EXPECT_LT(Time(last.layers[47]), 0.3 * kDenseLayer);
  auto deepest = [](const TraceRecord& r) { return Time(r.layers[47]); };
  EXPECT_LT(MeanOver(t, true, 0.1, deepest), MeanOver(t, false, 0.1, deepest));
}

TEST(ScenarioTest, MoELayersAlternateAndTheirRoutedLoadSpreads) {
  Trace t = Exact(Scenario::kMoE);
  for (const TraceRecord& r : t) {
    for (size_t i = 0; i < r.layers.size(); i += 2) {
      EXPECT_DOUBLE_EQ(Time(r.layers[i]), kDenseLayer);  // dense layers
      EXPECT_EQ(r.layers[i].mem_bytes, kDenseBytes);
    }
    for (size_t i = 1; i < r.layers.size(); i += 2) {
      EXPECT_GE(Time(r.layers[i]), kDenseLayer);  // waits for busiest expert
      EXPECT_GT(r.layers[i].mem_bytes, kDenseBytes);
    }
  }
  auto spread = [](const TraceRecord& r) {
    double lo = 1e9, hi = 0;
    for (size_t i = 1; i < r.layers.size(); i += 2) {
      lo = std::min(lo, Time(r.layers[i]));
      hi = std::max(hi, Time(r.layers[i]));
    }
    return hi / lo - 1;
  };
  const double early = MeanOver(t, false, 0.05, spread);
  const double late = MeanOver(t, true, 0.1, spread);
  std::cout << "MoE layer spread " << early << " -> " << late << "\n";
  EXPECT_LT(early, 0.25);
  EXPECT_GT(late, early + 0.1);
  EXPECT_LT(late, 0.6);
  // Routing drifts from one iteration to the next.
  EXPECT_NE(t[100].layers[31].fwd_s, t[101].layers[31].fwd_s);
}

TEST(ScenarioTest, MoDRoutedBlocksShrinkToTheirCapacity) {
  Trace t = Exact(Scenario::kMoD);
  auto routed_share = [](const TraceRecord& r) {
    double routed = 0, full = 0;
    for (size_t i = 0; i < r.layers.size(); ++i) {
      (i % 2 ? routed : full) += Time(r.layers[i]);
    }
    return routed / full;
  };
  EXPECT_NEAR(routed_share(t.front()), 1.0, 0.05);
  const double late = routed_share(t.back());
  EXPECT_GT(late, 0.05);  // 12.5% capacity, give or take the predictor
  EXPECT_LT(late, 0.3);
  // The predictor's errors make routed blocks differ from one another.
  EXPECT_NE(Time(t.back().layers[1]), Time(t.back().layers[3]));
}

}  // namespace
}  // namespace dynmo::core

namespace dynmo::core {
namespace {

TEST(ScenarioTest, SplitBlocksGiveHalvesThatAddUpToTheBlock) {
  for (const char* name :
       {"pruning", "freezing", "sparse-attention", "early-exit", "moe", "mod"}) {
    ScenarioConfig c;
    c.scenario = *ParseScenario(name);
    c.layers = 6;
    c.iterations = 30;
    c.timing_noise = 0;
    auto blocks = GenerateScenario(c);
    c.split_blocks = true;
    auto halves = GenerateScenario(c);
    ASSERT_TRUE(blocks.ok() && halves.ok()) << name;
    for (int k = 0; k < 30; ++k) {
      ASSERT_EQ((*halves)[k].layers.size(), 12u);
      for (int i = 0; i < 6; ++i) {
        const TraceLayer& b = (*blocks)[k].layers[i];
        const TraceLayer& a = (*halves)[k].layers[2 * i];
        const TraceLayer& m = (*halves)[k].layers[2 * i + 1];
        EXPECT_NEAR(a.fwd_s + m.fwd_s, b.fwd_s, 1e-15) << name << " " << k << " " << i;
        EXPECT_NEAR(a.bwd_s + m.bwd_s, b.bwd_s, 1e-15) << name;
        EXPECT_NEAR(a.wgrad_s + m.wgrad_s, b.wgrad_s, 1e-15) << name;
        EXPECT_EQ(a.mem_bytes + m.mem_bytes, b.mem_bytes) << name;
      }
    }
  }
}

}  // namespace
}  // namespace dynmo::core
