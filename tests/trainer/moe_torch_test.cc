// Mixture of Experts (trainer/model/moe.h): top-2 routing with capacity
// on hand-made router probabilities, the load-balancing loss, the MoE MLP
// against a per-token reference loop, and gradients to router and experts.
#include "trainer/model/moe.h"

#include <torch/torch.h>

#include <vector>

#include "gtest/gtest.h"
#include "trainer/config/config.h"
#include "trainer/model/gpt_layers.h"
#include "trainer/model/make_layer.h"

namespace dynmo::trainer {
namespace {

ModelConfig MoeModel(int experts, double capacity_factor, double aux_weight) {
  ModelConfig m;
  m.hidden = 16;
  m.heads = 2;
  m.seq_len = 8;
  m.dynamism.cases = {"moe"};
  m.dynamism.moe_experts = experts;
  m.dynamism.moe_capacity_factor = capacity_factor;
  m.dynamism.moe_aux_loss_weight = aux_weight;
  return m;
}

// Four tokens, four experts: first choices 0,0,0,3; second 1,2,1,2.
torch::Tensor HandMadeProbs() {
  return torch::tensor({0.5f, 0.3f, 0.1f, 0.1f,     //
                        0.6f, 0.1f, 0.2f, 0.1f,     //
                        0.4f, 0.35f, 0.15f, 0.1f,   //
                        0.1f, 0.2f, 0.3f, 0.4f})
      .view({4, 4});
}

std::vector<int64_t> ToVector(const torch::Tensor& t) {
  torch::Tensor c = t.to(torch::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

TEST(MoeTest, CapacityIsFactorTimesTwoTokensPerExpertRoundedUp) {
  EXPECT_EQ(MoeCapacity(1.25, 64, 4), 40);
  EXPECT_EQ(MoeCapacity(1.0, 10, 4), 5);
  EXPECT_EQ(MoeCapacity(1.0, 10, 3), 7);
  EXPECT_EQ(MoeCapacity(0.01, 1, 8), 1);  // never zero
}

TEST(MoeTest, TopTwoRoutingRenormalisesGatesAndDropsFirstChoicesBeyondCapacity) {
  MoeRouting r = RouteTopTwo(HandMadeProbs(), /*capacity=*/2);
  EXPECT_EQ(ToVector(r.experts.select(1, 0)), (std::vector<int64_t>{0, 0, 0, 3}));
  EXPECT_EQ(ToVector(r.experts.select(1, 1)), (std::vector<int64_t>{1, 2, 1, 2}));
  EXPECT_NEAR(r.gates[0][0].item<float>(), 0.5f / 0.8f, 1e-6);
  EXPECT_NEAR(r.gates[0][1].item<float>(), 0.3f / 0.8f, 1e-6);
  EXPECT_NEAR(r.gates[3][0].item<float>(), 0.4f / 0.7f, 1e-6);
  // Expert 0 holds two: token 2's first choice is the one dropped.
  EXPECT_EQ(r.dropped.item<int64_t>(), 1);
  EXPECT_FALSE(r.kept[2][0].item<bool>());
  EXPECT_TRUE(r.kept[2][1].item<bool>());
  const torch::Tensor assigned = r.assigned.to(torch::kLong).contiguous();
  EXPECT_EQ(std::vector<int64_t>(assigned.data_ptr<int64_t>(),
                                 assigned.data_ptr<int64_t>() + assigned.numel()),
            (std::vector<int64_t>{3, 2, 2, 1}));
  EXPECT_EQ(ToVector(r.tokens[0]), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(ToVector(r.tokens[1]), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(ToVector(r.tokens[2]), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(ToVector(r.tokens[3]), (std::vector<int64_t>{3}));
  EXPECT_NEAR(r.token_gates[1][1].item<float>(), 0.35f / 0.75f, 1e-6);
}

TEST(MoeTest, SecondChoicesQueueBehindEveryFirstChoice) {
  // Token 0 picks (1, 0); tokens 1 and 2 pick expert 0 first. With capacity
  // 2, token 0's second choice of expert 0 is the one that does not fit.
  torch::Tensor probs = torch::tensor({0.3f, 0.6f, 0.1f,  //
                                       0.7f, 0.2f, 0.1f,  //
                                       0.8f, 0.1f, 0.1f})
                            .view({3, 3});
  MoeRouting r = RouteTopTwo(probs, 2);
  EXPECT_TRUE(r.kept[1][0].item<bool>());
  EXPECT_TRUE(r.kept[2][0].item<bool>());
  EXPECT_FALSE(r.kept[0][1].item<bool>());
  EXPECT_EQ(ToVector(r.tokens[0]), (std::vector<int64_t>{1, 2}));
}

TEST(MoeTest, OneSortedDispatchSelectsWhatAPerExpertScanWould) {
  // The dispatch groups the kept slots with one stable sort and one read of
  // the experts' counts; a scan per expert (one wait each) is the reference:
  // same tokens, same order, same gates, for every expert.
  torch::manual_seed(11);
  const int64_t n = 96, e = 8;
  torch::Tensor probs = torch::softmax(torch::randn({n, e}) * 2, /*dim=*/1);
  MoeRouting r = RouteTopTwo(probs, MoeCapacity(0.75, n, e));
  ASSERT_GT(r.dropped.item<int64_t>(), 0) << "capacity 0.75 must drop some assignments";
  torch::Tensor slot_expert = r.experts.t().reshape({2 * n});
  torch::Tensor slot_kept = r.kept.t().reshape({2 * n});
  torch::Tensor slot_token = torch::arange(n, torch::kLong).repeat({2});
  torch::Tensor slot_gate = r.gates.t().reshape({2 * n});
  ASSERT_EQ(static_cast<int64_t>(r.tokens.size()), e);
  for (int64_t x = 0; x < e; ++x) {
    torch::Tensor slots = torch::nonzero(slot_kept & (slot_expert == x)).view({-1});
    EXPECT_EQ(ToVector(r.tokens[x]), ToVector(slot_token.index_select(0, slots))) << x;
    EXPECT_TRUE(torch::equal(r.token_gates[x], slot_gate.index_select(0, slots))) << x;
  }
}

TEST(MoeTest, BalanceLossIsOneWhenUniformAndGrowsWithSkew) {
  // A cyclic preference: every expert gets a quarter of the assignments
  // and a quarter of the probability mass.
  torch::Tensor cyclic = torch::zeros({8, 4});
  for (int n = 0; n < 8; ++n) {
    cyclic[n][n % 4] = 0.4f;
    cyclic[n][(n + 1) % 4] = 0.3f;
    cyclic[n][(n + 2) % 4] = 0.2f;
    cyclic[n][(n + 3) % 4] = 0.1f;
  }
  MoeRouting balanced = RouteTopTwo(cyclic, 100);
  EXPECT_NEAR(MoeBalanceLoss(cyclic, balanced).item<float>(), 1.0f, 1e-5);
  // Hand-made: f = (3,2,2,1)/8, P = (0.4, 0.2375, 0.1875, 0.175).
  torch::Tensor probs = HandMadeProbs();
  MoeRouting r = RouteTopTwo(probs, 2);
  const float expected =
      4.0f * (3 * 0.4f + 2 * 0.2375f + 2 * 0.1875f + 1 * 0.175f) / 8.0f;
  EXPECT_NEAR(MoeBalanceLoss(probs, r).item<float>(), expected, 1e-5);
  EXPECT_GT(expected, 1.0f);
}

TEST(MoeTest, ForwardEqualsAPerTokenReferenceLoopIncludingDroppedTokens) {
  torch::manual_seed(3);
  MoeMlp moe(MoeModel(4, /*capacity_factor=*/0.5, 0.01));
  torch::Tensor x = torch::randn({2, 8, 16});
  MicroBatchContext ctx;
  torch::Tensor y = moe.Forward(x, ctx);
  const MoeRouting& r = moe.last_routing();
  ASSERT_GT(r.dropped.item<int64_t>(), 0) << "capacity 0.5 must drop some assignments";

  torch::NoGradGuard no_grad;
  torch::Tensor flat = x.view({16, 16});
  torch::Tensor probs = torch::softmax(moe.router()(flat), 1);
  torch::Tensor expected = torch::zeros({16, 16});
  for (int64_t n = 0; n < 16; ++n) {
    for (int c = 0; c < 2; ++c) {
      if (!r.kept[n][c].item<bool>()) continue;
      const int e = static_cast<int>(r.experts[n][c].item<int64_t>());
      const float gate = r.gates[n][c].item<float>();
      expected[n] += gate * moe.expert(e).Forward(flat.narrow(0, n, 1), ctx)[0];
    }
  }
  EXPECT_TRUE(torch::allclose(y.view({16, 16}), expected, 1e-5, 1e-6));
  // A token with both choices dropped gets nothing: the residual carries it.
  torch::Tensor both_dropped = ~(r.kept.any(1));
  if (both_dropped.any().item<bool>()) {
    torch::Tensor rows = torch::nonzero(both_dropped).view({-1});
    EXPECT_EQ(y.view({16, 16}).index_select(0, rows).abs().sum().item<float>(), 0.0f);
  }
  ASSERT_EQ(ctx.aux_losses.size(), 1u);
  EXPECT_NEAR(ctx.aux_losses[0].item<float>(),
              0.01f * MoeBalanceLoss(probs, r).item<float>(), 1e-6);
}

TEST(MoeTest, GradientReachesTheRouterAndEveryExpertThatReceivedTokens) {
  torch::manual_seed(5);
  MoeMlp moe(MoeModel(4, 2.0, 0.01));
  torch::Tensor x = torch::randn({2, 8, 16}, torch::requires_grad());
  MicroBatchContext ctx;
  torch::Tensor y = moe.Forward(x, ctx);
  (y.pow(2).sum() + ctx.aux_losses[0]).backward();
  ASSERT_TRUE(moe.router()->weight.grad().defined());
  EXPECT_GT(moe.router()->weight.grad().abs().sum().item<float>(), 0.0f);
  for (int e = 0; e < moe.num_experts(); ++e) {
    if (moe.last_routing().tokens[e].numel() == 0) continue;
    ASSERT_TRUE(moe.expert(e).in()->weight.grad().defined()) << "expert " << e;
    EXPECT_GT(moe.expert(e).in()->weight.grad().abs().sum().item<float>(), 0.0f);
  }
  EXPECT_GT(x.grad().abs().sum().item<float>(), 0.0f);
}

TEST(MoeTest, TheBalanceLossAloneTrainsTheRouter) {
  torch::manual_seed(6);
  MoeMlp moe(MoeModel(4, 2.0, 1.0));
  MicroBatchContext ctx;
  moe.Forward(torch::randn({2, 8, 16}), ctx);
  ctx.aux_losses[0].backward();
  EXPECT_GT(moe.router()->weight.grad().abs().sum().item<float>(), 0.0f);
}

TEST(MoeTest, ExpertsThatReceiveNoTokensDoNoWork) {
  torch::manual_seed(7);
  MoeMlp moe(MoeModel(4, 2.0, 0.0));
  {
    // Inputs are all positive; experts 2 and 3 score far below 0 and 1.
    torch::NoGradGuard no_grad;
    moe.router()->weight.zero_();
    moe.router()->weight[0].fill_(1.0);
    moe.router()->weight[1].fill_(0.5);
    moe.router()->weight[2].fill_(-5.0);
    moe.router()->weight[3].fill_(-5.0);
  }
  MicroBatchContext ctx;
  torch::Tensor y = moe.Forward(torch::rand({2, 8, 16}) + 0.1, ctx);
  EXPECT_EQ(moe.last_routing().tokens[0].numel(), 16);
  EXPECT_EQ(moe.last_routing().tokens[1].numel(), 16);
  EXPECT_EQ(moe.last_routing().tokens[2].numel(), 0);
  EXPECT_EQ(moe.last_routing().tokens[3].numel(), 0);
  y.sum().backward();
  EXPECT_FALSE(moe.expert(2).in()->weight.grad().defined());
  EXPECT_FALSE(moe.expert(3).in()->weight.grad().defined());
}

TEST(MoeTest, MakeLayerBuildsMoeBlocksOnItsScheduleWithTheDocumentedParameterCount) {
  ModelConfig m = MoeModel(4, 1.25, 0.01);
  m.num_blocks = 4;
  m.dynamism.moe_blocks = {2, 2};  // blocks 2 and 4
  for (int id = 1; id <= 4; ++id) {
    std::shared_ptr<PipelineLayer> layer = MakeLayer(m, id, 11);
    int64_t count = 0;
    for (const torch::Tensor& p : layer->parameters()) count += p.numel();
    EXPECT_EQ(count, LayerParameterCount(m, id)) << "block " << id;
    EXPECT_EQ(m.dynamism.IsMoeBlock(id), id % 2 == 0);
    MicroBatchContext ctx;
    torch::Tensor y = layer->Forward(torch::randn({2, 8, 16}), ctx);
    EXPECT_EQ(y.sizes(), torch::IntArrayRef({2, 8, 16}));
    EXPECT_EQ(ctx.aux_losses.size(), id % 2 == 0 ? 1u : 0u) << "block " << id;
  }
}

}  // namespace
}  // namespace dynmo::trainer
