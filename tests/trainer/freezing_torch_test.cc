// Layer freezing (trainer/dynamism/freezing.h): the job-wide schedule
// freezes strictly front to back after a window of low-plasticity checks,
// and a stage running under a frozen prefix leaves frozen layers untouched
// (no gradient, no optimizer step, no backward time) while the rest train,
// reporting "model changed" for the first iteration under the new prefix.
#include <torch/torch.h>

#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "trainer/comm/transport.h"
#include "trainer/data/open_token_corpus.h"
#include "trainer/data/token_corpus.h"
#include "trainer/dynamism/freezing.h"
#include "trainer/stage/pipeline_stage.h"

namespace dynmo::trainer {
namespace {

FreezingConfig Params(double threshold, int window, int max_layers = 0) {
  FreezingConfig c;
  c.every = 1;
  c.threshold = threshold;
  c.window = window;
  c.max_layers = max_layers;
  return c;
}

TEST(FreezeScheduleTest, FreezesOnlyFrontToBack) {
  // 5 layers; plasticity = change / first change. First check sets 1.0.
  FreezeSchedule s(Params(0.5, 1), 5);
  const std::vector<bool> all(5, true);
  EXPECT_EQ(s.Observe({1, 1, 1, 1, 1}, all), 0);
  // Layers 1 and 2 slowed down, layer 0 did not: nothing may freeze.
  EXPECT_EQ(s.Observe({0.9, 0.1, 0.1, 1, 1}, all), 0);
  // Now layer 0 slows down too: 0, 1 and 2 freeze together; 3 did not.
  EXPECT_EQ(s.Observe({0.1, 0.1, 0.1, 0.9, 0.1}, all), 3);
  EXPECT_NEAR(s.plasticity(0), 0.1, 1e-12);
}

TEST(FreezeScheduleTest, WindowNeedsConsecutiveLowChecks) {
  FreezeSchedule s(Params(0.5, 2), 3);
  const std::vector<bool> all(3, true);
  s.Observe({1, 1, 1}, all);
  EXPECT_EQ(s.Observe({0.1, 1, 1}, all), 0);  // one low check
  EXPECT_EQ(s.Observe({0.9, 1, 1}, all), 0);  // streak broken
  EXPECT_EQ(s.Observe({0.1, 1, 1}, all), 0);
  EXPECT_EQ(s.Observe({0.1, 1, 1}, all), 1);  // two in a row
}

TEST(FreezeScheduleTest, MissingMeasurementKeepsTheStreak) {
  FreezeSchedule s(Params(0.5, 2), 3);
  s.Observe({1, 1, 1}, {true, true, true});
  EXPECT_EQ(s.Observe({0.1, 1, 1}, {true, true, true}), 0);
  // Layer 0 just migrated: no reference, no value this time.
  EXPECT_EQ(s.Observe({0, 1, 1}, {false, true, true}), 0);
  EXPECT_EQ(s.Observe({0.1, 1, 1}, {true, true, true}), 1);
}

TEST(FreezeScheduleTest, TheHeadNeverFreezesAndMaxLayersCaps) {
  FreezeSchedule all(Params(10, 1), 4);
  all.Observe({1, 1, 1, 1}, std::vector<bool>(4, true));
  EXPECT_EQ(all.Observe({1, 1, 1, 1}, std::vector<bool>(4, true)), 3);
  FreezeSchedule capped(Params(10, 1, 2), 4);
  capped.Observe({1, 1, 1, 1}, std::vector<bool>(4, true));
  EXPECT_EQ(capped.Observe({1, 1, 1, 1}, std::vector<bool>(4, true)), 2);
}

std::vector<torch::Tensor> Snapshot(OwnedLayer& owned) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : owned.layer->parameters()) out.push_back(p.detach().clone());
  return out;
}

bool Same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

TEST(FreezingStageTest, FrozenLayersStopTrainingAndRunNoBackward) {
  absl::StatusOr<std::unique_ptr<TokenCorpus>> corpus = OpenTokenCorpus(
      std::string(DYNMO_SOURCE_DIR) + "/trainer/data/declaration_of_independence.txt");
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  absl::StatusOr<std::unique_ptr<Transport>> transport =
      ConnectGlooTransport(DistEnv{}, TransportOptions{});
  ASSERT_TRUE(transport.ok()) << transport.status();

  TrainerConfig config;
  config.model.num_blocks = 3;
  config.model.hidden = 32;
  config.model.seq_len = 16;
  config.micro_batch = 2;
  config.microbatches = 2;
  config.model.dynamism.cases = {"freezing"};
  // Checks after every iteration; the second check (iteration 1) freezes
  // layers 0 and 1 whatever the plasticity (threshold far above 1).
  config.model.dynamism.freezing = Params(100, 1, 2);
  const core::Boundaries b = {0, 5};
  PipelineStage stage(config, b, 0, 0, transport->get(), corpus->get());

  StageIterationStats stats;
  ASSERT_TRUE(stage.RunIteration(0, &stats).ok());
  EXPECT_FALSE(stage.TakeModelChanged());
  ASSERT_TRUE(stage.RunIteration(1, &stats).ok());
  EXPECT_FALSE(stage.TakeModelChanged()) << "decided, but not run under it yet";

  std::vector<std::vector<torch::Tensor>> before;
  for (OwnedLayer& owned : stage.layers()) before.push_back(Snapshot(owned));
  ASSERT_TRUE(stage.RunIteration(2, &stats).ok());
  EXPECT_TRUE(stage.TakeModelChanged()) << "first iteration under the new prefix";
  for (int l = 0; l < 5; ++l) {
    OwnedLayer& owned = stage.layers()[l];
    const bool frozen = l < 2;
    EXPECT_EQ(Same(before[l], Snapshot(owned)), frozen) << "layer " << l;
    for (const torch::Tensor& p : owned.layer->parameters()) {
      EXPECT_EQ(p.requires_grad(), !frozen) << "layer " << l;
      EXPECT_EQ(p.grad().defined(), !frozen) << "layer " << l;
    }
    if (frozen) {
      EXPECT_EQ(stats.backward_s[l], 0.0) << "layer " << l;
    } else {
      EXPECT_GT(stats.backward_s[l], 0.0) << "layer " << l;
    }
    EXPECT_GT(stats.forward_s[l], 0.0) << "frozen layers still run forward";
  }
  ASSERT_TRUE(stage.RunIteration(3, &stats).ok());
  EXPECT_FALSE(stage.TakeModelChanged()) << "reported once";
}

}  // namespace
}  // namespace dynmo::trainer
