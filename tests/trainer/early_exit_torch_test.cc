// Early exit, the layer side (trainer/model/early_exit.h): a block run on
// the tokens still in flight computes exactly what the full block computes
// for them (forward and gradients), copies the exited tokens through, and
// the exit point's decisions and the mask's wire format behave as
// documented. How much less work it does is a benchmark's question
// (bench/exit_block_bench.cc), not a test's.
#include <torch/torch.h>

#include <algorithm>
#include <iostream>

#include "gtest/gtest.h"
#include "trainer/model/decoder_block.h"
#include "trainer/model/early_exit.h"
#include "trainer/model/gpt_layers.h"
#include "trainer/model/make_layer.h"

namespace dynmo::trainer {
namespace {

ModelConfig SmallModel(int hidden = 32, int seq_len = 16) {
  ModelConfig m;
  m.num_blocks = 4;
  m.hidden = hidden;
  m.heads = 4;
  m.seq_len = seq_len;
  m.vocab = 64;
  return m;
}

MicroBatchContext Context(int64_t b, int64_t t, int64_t vocab) {
  MicroBatchContext ctx;
  ctx.targets = torch::randint(vocab, {b, t}, torch::kLong);
  return ctx;
}

TEST(EarlyExitTest, GatheredBlockEqualsFullBlockOnActiveTokensAndCopiesTheRest) {
  at::set_num_threads(1);
  const ModelConfig m = SmallModel();
  std::shared_ptr<PipelineLayer> block = MakeLayer(m, 1, 7);
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({3, m.seq_len, m.hidden});
  const torch::Tensor active = torch::rand({3, m.seq_len}) < 0.4;
  ASSERT_GT(active.sum().item<int64_t>(), 0);
  ASSERT_LT(active.sum().item<int64_t>(), 3 * m.seq_len);
  const torch::Tensor weights = torch::randn({3, m.seq_len, m.hidden});

  // Full block on every token; loss over the active tokens only.
  MicroBatchContext full_ctx = Context(3, m.seq_len, m.vocab);
  torch::Tensor x_full = x.clone().requires_grad_(true);
  torch::Tensor full = block->Forward(x_full, full_ctx);
  (full * weights)
      .masked_select(active.unsqueeze(-1).expand_as(full))
      .sum()
      .backward();
  std::vector<torch::Tensor> full_grads;
  for (const torch::Tensor& p : block->parameters()) {
    full_grads.push_back(p.grad().clone());
    p.mutable_grad() = torch::Tensor();
  }

  MicroBatchContext ctx = full_ctx;
  ctx.token_active = active;
  torch::Tensor x_sub = x.clone().requires_grad_(true);
  torch::Tensor sub = block->Forward(x_sub, ctx);
  const torch::Tensor a = active.unsqueeze(-1).expand_as(sub);
  EXPECT_TRUE(torch::allclose(sub.masked_select(a), full.masked_select(a), 1e-5, 1e-5));
  EXPECT_TRUE(torch::equal(sub.masked_select(~a), x.masked_select(~a)))
      << "exited tokens are copied through unchanged";
  (sub * weights).masked_select(a).sum().backward();
  size_t i = 0;
  for (const torch::Tensor& p : block->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_TRUE(torch::allclose(p.grad(), full_grads[i], 1e-4, 1e-5)) << "parameter " << i;
    ++i;
  }
  // Exited tokens get gradient only as the active tokens' keys / values.
  EXPECT_TRUE(torch::allclose(x_sub.grad(), x_full.grad(), 1e-4, 1e-5));
}

TEST(EarlyExitTest, ExitPointAddsItsLossAndClearsConfidentTokens) {
  ModelConfig m = SmallModel();
  m.dynamism.cases = {"early-exit"};
  m.dynamism.early_exit.threshold = 0.0;  // every token is confident enough
  EarlyExitHead head(m);
  MicroBatchContext ctx = Context(2, m.seq_len, m.vocab);
  head.Decide(torch::randn({2, m.seq_len, m.hidden}), ctx);
  ASSERT_EQ(ctx.aux_losses.size(), 1u);
  EXPECT_TRUE(ctx.aux_losses[0].requires_grad());
  ASSERT_TRUE(ctx.token_active.defined());
  EXPECT_EQ(ctx.token_active.sum().item<int64_t>(), 0);
  EXPECT_EQ(head.TakeCounts(), (std::pair<int64_t, int64_t>{2 * m.seq_len, 2 * m.seq_len}));

  m.dynamism.early_exit.threshold = 1.0;  // nobody is that sure
  EarlyExitHead strict(m);
  MicroBatchContext none = Context(2, m.seq_len, m.vocab);
  strict.Decide(torch::randn({2, m.seq_len, m.hidden}), none);
  EXPECT_FALSE(none.token_active.defined()) << "nobody left: the mask stays 'all'";
  EXPECT_EQ(strict.TakeCounts().second, 0);
}

TEST(EarlyExitTest, OnlyBlocksFromExitAfterToTheSecondLastHaveExitPoints) {
  ModelConfig m = SmallModel();
  m.dynamism.cases = {"early-exit"};
  m.dynamism.early_exit.after = 2;
  std::vector<int> with;
  for (int id = 1; id <= m.num_blocks; ++id) {
    auto* block = dynamic_cast<DecoderBlock*>(MakeLayer(m, id, 1).get());
    ASSERT_NE(block, nullptr);
    if (block->exit_head() != nullptr) with.push_back(id);
  }
  EXPECT_EQ(with, (std::vector<int>{2, 3}));
}

TEST(EarlyExitTest, MaskWireFormatRoundTripsAndAllActiveIsUndefined) {
  const torch::Tensor all = TokenMaskToWire(torch::Tensor(), 2, 5);
  EXPECT_EQ(all.scalar_type(), torch::kUInt8);
  EXPECT_EQ(all.sum().item<int64_t>(), 10);
  EXPECT_FALSE(TokenMaskFromWire(all).defined());
  torch::Tensor some = torch::rand({2, 5}) < 0.5;
  some.index_put_({0, 0}, false);
  EXPECT_TRUE(torch::equal(TokenMaskFromWire(TokenMaskToWire(some, 2, 5)), some));
}

}  // namespace
}  // namespace dynmo::trainer
