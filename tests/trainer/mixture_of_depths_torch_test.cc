// Mixture of Depths (trainer/dynamism/mixture_of_depths.h): the top-k
// tokens per sequence, in causal order, are the only ones the block runs;
// the rest pass unchanged; gradients reach the router through the output
// scale; the causal predictor learns top-k membership from its own BCE.
#include "trainer/dynamism/mixture_of_depths.h"

#include <torch/torch.h>

#include <vector>

#include "gtest/gtest.h"
#include "trainer/config.h"
#include "trainer/decoder_block.h"
#include "trainer/gpt_layers.h"

namespace dynmo::trainer {
namespace {

ModelConfig ModModel(double capacity) {
  ModelConfig m;
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
  int64_t routed = 0;
  MicroBatchContext ctx;
  router.Route(x, ctx, [&](const torch::Tensor& xs) {
    routed += xs.size(1);
    return xs;
  });
  EXPECT_TRUE(ctx.aux_losses.empty());
  EXPECT_GT(routed, 8 * 2);
  EXPECT_LT(routed, 8 * 8);
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

}  // namespace
}  // namespace dynmo::trainer
