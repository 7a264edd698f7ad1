// Mixture of Depths (trainer/model/mixture_of_depths.h): the top-k
// tokens per sequence, in causal order, are the only ones the block runs;
// the rest pass unchanged; gradients reach the router through the output
// scale; the causal predictor learns top-k membership from its own BCE.
// Under predictor routing the tokens with a positive predictor logit run,
// packed with padding that never changes a routed token's output, and the
// count moves as the predictor learns.
#include "trainer/model/mixture_of_depths.h"

#include <torch/torch.h>

#include <cstdlib>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "trainer/config/config.h"
#include "trainer/model/decoder_block.h"
#include "trainer/model/gpt_layers.h"
#include "trainer/model/make_layer.h"

namespace dynmo::trainer {
namespace {

ModelConfig ModModel(double capacity, const char* routing = "topk") {
  ModelConfig m;
  m.dynamism.mod_routing = routing;
  m.hidden = 8;
  m.heads = 2;
  m.seq_len = 16;
  m.num_blocks = 4;
  m.dynamism.cases = {"mod"};
  m.dynamism.mod_capacity = capacity;
  return m;
}

TEST(MixtureOfDepthsTest, TokensPerSequenceAreTheCapacityFractionRoundedAtLeastOne) {
  EXPECT_EQ(ModTokens(0.25, 32), 8);
  EXPECT_EQ(ModTokens(0.125, 16), 2);
  EXPECT_EQ(ModTokens(0.01, 10), 1);
  EXPECT_EQ(ModTokens(1.0, 7), 7);
}

TEST(MixtureOfDepthsTest, OnlyTheTopKTokensInCausalOrderRunAndTheRestPassUnchanged) {
  torch::manual_seed(1);
  MixtureOfDepthsRouter router(ModModel(0.25));
  torch::Tensor x = torch::randn({3, 16, 8});
  std::vector<int64_t> body_shape;
  auto body = [&](const torch::Tensor& xs) {
    body_shape = xs.sizes().vec();
    return 3 * xs + 1;
  };
  MicroBatchContext ctx;
  torch::Tensor y = router.Route(x, ctx, body);
  EXPECT_EQ(body_shape, (std::vector<int64_t>{3, 4, 8})) << "the block sees k tokens";

  torch::NoGradGuard no_grad;
  torch::Tensor scores = router.router()(x).squeeze(-1);
  torch::Tensor idx = router.last_selected();
  ASSERT_EQ(idx.sizes(), torch::IntArrayRef({3, 4}));
  for (int64_t b = 0; b < 3; ++b) {
    torch::Tensor expected = std::get<0>(std::get<1>(scores[b].topk(4)).sort());
    EXPECT_TRUE(torch::equal(idx[b], expected)) << "sequence " << b;
    torch::Tensor chosen = torch::zeros({16}, torch::kBool).index_fill(0, idx[b], true);
    for (int64_t t = 0; t < 16; ++t) {
      if (!chosen[t].item<bool>()) {
        EXPECT_TRUE(torch::equal(y[b][t], x[b][t])) << "skipped token " << t;
      } else {
        const float w = torch::sigmoid(scores[b][t]).item<float>();
        torch::Tensor want = x[b][t] + w * (3 * x[b][t] + 1 - x[b][t]);
        EXPECT_TRUE(torch::allclose(y[b][t], want, 1e-5, 1e-6)) << "routed token " << t;
      }
    }
  }
}

TEST(MixtureOfDepthsTest, TheRouterLearnsThroughTheOutputScaleAndThePredictorOnlyThroughItsLoss) {
  torch::manual_seed(2);
  MixtureOfDepthsRouter router(ModModel(0.5));
  torch::Tensor x = torch::randn({2, 16, 8}, torch::requires_grad());
  MicroBatchContext ctx;
  torch::Tensor y = router.Route(x, ctx, [](const torch::Tensor& xs) { return xs * 2; });
  ASSERT_EQ(ctx.aux_losses.size(), 1u);
  // The main path: router gets a gradient, the predictor none.
  y.pow(2).sum().backward({}, /*retain_graph=*/true);
  EXPECT_GT(router.router()->weight.grad().abs().sum().item<float>(), 0.0f);
  for (const auto& p : router.named_parameters()) {
    if (p.key().rfind("predictor", 0) == 0) {
      EXPECT_FALSE(p.value().grad().defined()) << p.key();
    }
  }
  // The predictor's loss: reaches the predictor, not the block input.
  torch::Tensor x_grad_before = x.grad().clone();
  router.router()->weight.grad().zero_();
  ctx.aux_losses[0].backward();
  EXPECT_TRUE(torch::equal(x.grad(), x_grad_before));
  EXPECT_EQ(router.router()->weight.grad().abs().sum().item<float>(), 0.0f);
  bool predictor_learns = false;
  for (const auto& p : router.named_parameters()) {
    if (p.key().rfind("predictor", 0) == 0 && p.value().grad().defined()) {
      predictor_learns = predictor_learns || p.value().grad().abs().sum().item<float>() > 0;
    }
  }
  EXPECT_TRUE(predictor_learns);
}

TEST(MixtureOfDepthsTest, ThePredictorLearnsTopKMembershipAndDrivesEvalRouting) {
  torch::manual_seed(3);
  MixtureOfDepthsRouter router(ModModel(0.25));
  std::vector<torch::Tensor> params;
  for (const auto& p : router.named_parameters()) {
    if (p.key().rfind("predictor", 0) == 0) params.push_back(p.value());
  }
  torch::optim::Adam adam(params, torch::optim::AdamOptions(0.01));
  torch::Tensor x = torch::randn({8, 16, 8});
  auto identity = [](const torch::Tensor& xs) { return xs; };
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    MicroBatchContext ctx;
    router.Route(x, ctx, identity);
    adam.zero_grad();
    ctx.aux_losses[0].backward();
    adam.step();
    (step == 0 ? first : last) = ctx.aux_losses[0].item<double>();
  }
  EXPECT_LT(last, 0.5 * first) << "BCE " << first << " -> " << last;
  // Eval mode routes by the predictor: its picks agree with the top-k.
  router.eval();
  MicroBatchContext ctx;
  router.Route(x, ctx, identity);
  EXPECT_TRUE(ctx.aux_losses.empty());
  EXPECT_GT(router.last_routed(), 8 * 2);
  EXPECT_LT(router.last_routed(), 8 * 8);
}

TEST(MixtureOfDepthsTest, ModBlocksFollowTheScheduleAndKeepTheirShapeWithGradients) {
  ModelConfig m = ModModel(0.25);
  m.dynamism.mod_blocks = {2, 2};  // blocks 2 and 4
  for (int id = 1; id <= 4; ++id) {
    std::shared_ptr<PipelineLayer> layer = MakeLayer(m, id, 5);
    auto* block = dynamic_cast<DecoderBlock*>(layer.get());
    ASSERT_NE(block, nullptr);
    EXPECT_EQ(block->depth_router() != nullptr, id % 2 == 0) << "block " << id;
    int64_t count = 0;
    for (const torch::Tensor& p : layer->parameters()) count += p.numel();
    EXPECT_EQ(count, LayerParameterCount(m, id)) << "block " << id;
    torch::Tensor x = torch::randn({2, 16, 8}, torch::requires_grad());
    MicroBatchContext ctx;
    torch::Tensor y = layer->Forward(x, ctx);
    EXPECT_EQ(y.sizes(), x.sizes());
    y.sum().backward();
    EXPECT_TRUE(x.grad().defined());
  }
}

TEST(MixtureOfDepthsTest, PredictorRoutingRunsExactlyThePositiveLogitTokensAndPassesTheRest) {
  // The first seed (from 4) whose fresh predictor routes some tokens, not all.
  std::unique_ptr<MixtureOfDepthsRouter> made;
  torch::Tensor x;
  for (int seed = 4; seed < 40 && made == nullptr; ++seed) {
    torch::manual_seed(seed);
    auto candidate = std::make_unique<MixtureOfDepthsRouter>(ModModel(0.25, "predictor"));
    x = torch::randn({3, 16, 8});
    const int64_t n = (candidate->PredictorLogits(x) > 0).sum().item<int64_t>();
    if (n > 0 && n < 3 * 16) made = std::move(candidate);
  }
  ASSERT_NE(made, nullptr);
  MixtureOfDepthsRouter& router = *made;
  std::vector<int64_t> body_shape;
  auto body = [&](const torch::Tensor& xs) {
    body_shape = xs.sizes().vec();
    return 3 * xs + 1;
  };
  MicroBatchContext ctx;
  const torch::Tensor y = router.Route(x, ctx, body);
  ASSERT_EQ(ctx.aux_losses.size(), 1u) << "the predictor still learns the top-k";

  torch::NoGradGuard no_grad;
  const torch::Tensor chosen = router.PredictorLogits(x) > 0;
  const torch::Tensor per_sequence = chosen.sum(1);
  EXPECT_EQ(router.last_routed(), chosen.sum().item<int64_t>());
  EXPECT_EQ(body_shape, (std::vector<int64_t>{3, per_sequence.max().item<int64_t>(), 8}))
      << "packed to the longest sequence's count";
  const torch::Tensor scores = router.router()(x).squeeze(-1);
  for (int64_t b = 0; b < 3; ++b) {
    for (int64_t t = 0; t < 16; ++t) {
      if (!chosen[b][t].item<bool>()) {
        EXPECT_TRUE(torch::equal(y[b][t], x[b][t])) << "skipped token " << b << "," << t;
      } else {
        const float w = torch::sigmoid(scores[b][t]).item<float>();
        const torch::Tensor want = x[b][t] + w * (3 * x[b][t] + 1 - x[b][t]);
        EXPECT_TRUE(torch::allclose(y[b][t], want, 1e-5, 1e-6)) << "routed " << b << "," << t;
      }
    }
  }
}

TEST(MixtureOfDepthsTest, PaddingNeverChangesARoutedTokensOutputInARealBlock) {
  ModelConfig m = ModModel(0.25, "predictor");
  m.dynamism.mod_blocks = {1, 1};
  std::shared_ptr<PipelineLayer> block = MakeLayer(m, 1, 6);
  auto* router = dynamic_cast<MixtureOfDepthsRouter*>(
      dynamic_cast<DecoderBlock*>(block.get())->depth_router());
  ASSERT_NE(router, nullptr);
  torch::manual_seed(6);
  const torch::Tensor x = torch::randn({4, 16, 8});
  const torch::Tensor counts = (router->PredictorLogits(x) > 0).sum(1);
  ASSERT_GT((counts != counts.max()).sum().item<int64_t>(), 0)
      << "some sequence must be padded for this test to mean anything";
  MicroBatchContext ctx;
  const torch::Tensor together = block->Forward(x, ctx);
  for (int64_t b = 0; b < 4; ++b) {
    MicroBatchContext alone_ctx;
    const torch::Tensor alone = block->Forward(x.narrow(0, b, 1), alone_ctx);
    EXPECT_EQ(router->last_routed(), counts[b].item<int64_t>());
    EXPECT_TRUE(torch::allclose(together.narrow(0, b, 1), alone, 1e-5, 1e-6))
        << "sequence " << b << " (" << counts[b].item<int64_t>() << " of "
        << counts.max().item<int64_t>() << " slots real)";
  }
}

TEST(MixtureOfDepthsTest, PredictorRoutingSendsGradientsToTheBlockTheRouterAndTheInput) {
  ModelConfig m = ModModel(0.25, "predictor");
  m.dynamism.mod_blocks = {1, 1};
  std::shared_ptr<PipelineLayer> block = MakeLayer(m, 1, 7);
  torch::manual_seed(7);
  const torch::Tensor x = torch::randn({2, 16, 8}, torch::requires_grad());
  MicroBatchContext ctx;
  torch::Tensor loss = block->Forward(x, ctx).pow(2).sum();
  for (const torch::Tensor& aux : ctx.aux_losses) loss = loss + aux;
  loss.backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_GT(x.grad().abs().sum().item<float>(), 0.0f);
  for (const auto& p : block->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_GT(p.value().grad().abs().sum().item<float>(), 0.0f) << p.key();
  }
}

TEST(MixtureOfDepthsTest, PredictorRoutingLoadMovesTowardTheCapacityAsThePredictorLearns) {
  torch::manual_seed(8);
  MixtureOfDepthsRouter router(ModModel(0.25, "predictor"));
  std::vector<torch::Tensor> params;
  for (const auto& p : router.named_parameters()) {
    if (p.key().rfind("predictor", 0) == 0) params.push_back(p.value());
  }
  torch::optim::Adam adam(params, torch::optim::AdamOptions(0.01));
  const torch::Tensor x = torch::randn({8, 16, 8});
  const int64_t capacity = 8 * ModTokens(0.25, 16);
  std::vector<int64_t> routed;
  for (int step = 0; step < 150; ++step) {
    MicroBatchContext ctx;
    router.Route(x, ctx, [](const torch::Tensor& xs) { return xs; });
    routed.push_back(router.last_routed());
    adam.zero_grad();
    ctx.aux_losses[0].backward();
    adam.step();
  }
  EXPECT_NE(routed.front(), routed.back()) << "the load moved";
  EXPECT_LT(std::abs(routed.back() - capacity), std::abs(routed.front() - capacity))
      << routed.front() << " -> " << routed.back() << " tokens, capacity " << capacity;
  EXPECT_EQ(router.TakeCounts(), (std::pair<int64_t, int64_t>{
                                     150 * 8 * 16, std::accumulate(routed.begin(), routed.end(),
                                                                   int64_t{0})}));
}

TEST(MixtureOfDepthsTest, AnUnknownRoutingIsAOneLineErrorNamingTheFlag) {
  DynamismConfig d;
  d.cases = {"mod"};
  d.mod_routing = "random";
  const absl::Status s = ValidateDynamismParameters(d, 16);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "--mod_routing must be topk or predictor, not 'random'");
  d.mod_routing = "predictor";
  EXPECT_TRUE(ValidateDynamismParameters(d, 16).ok());
}

}  // namespace
}  // namespace dynmo::trainer
