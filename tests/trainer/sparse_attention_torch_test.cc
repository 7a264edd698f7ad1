// Hash-based block-sparse attention (trainer/model/sparse_attention.h):
// the block-pair rule on hand-made buckets, equality with dense causal
// attention (values and gradients) when every bucket matches, agreement
// with the CPU reference kernel, and less measured time with fewer matches.
#include "trainer/model/sparse_attention.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/block_sparse_attention_cpu.h"
#include "trainer/config/config.h"
#include "trainer/model/decoder_block.h"

namespace dynmo::trainer {
namespace {

torch::Tensor DenseCausal(const torch::Tensor& q, const torch::Tensor& k,
                          const torch::Tensor& v) {
  const int64_t t = q.size(1);
  torch::Tensor s = q.matmul(k.transpose(-2, -1)) / std::sqrt(double(q.size(2)));
  s = s.masked_fill(torch::triu(torch::ones({t, t}, torch::kBool), 1),
                    -std::numeric_limits<float>::infinity());
  return torch::softmax(s, -1).matmul(v);
}

// [rounds, BH, nb] buckets, every block in bucket b(qb).
torch::Tensor Buckets(int64_t bh, const std::vector<int64_t>& per_block) {
  torch::Tensor row = torch::tensor(per_block, torch::kLong);
  return row.view({1, 1, -1}).expand({1, bh, row.numel()}).contiguous();
}

TEST(SparseAttentionTest, PairsAreTheDiagonalPlusEarlierKeyBlocksInTheSameBucket) {
  BlockPairs p = SelectBlockPairs(Buckets(1, {0, 1, 0, 1}), Buckets(1, {0, 1, 0, 1}));
  EXPECT_EQ(p.count(), 6);  // 4 diagonal + (2,0) + (3,1)
  EXPECT_EQ(p.diagonal.sum().item<int64_t>(), 4);
  // Any round matching is enough: a second round that puts all in bucket 0.
  torch::Tensor q2 = torch::cat({Buckets(1, {0, 1, 0, 1}), Buckets(1, {0, 0, 0, 0})}, 0);
  EXPECT_EQ(SelectBlockPairs(q2, q2).count(), 10);  // dense: 4·5/2
  // Query and key hashes may differ: key block 0 in bucket 1 is attended by
  // query blocks hashed to 1.
  EXPECT_EQ(SelectBlockPairs(Buckets(1, {0, 1, 1, 1}), Buckets(1, {1, 0, 0, 0})).count(),
            4 + 3);
}

TEST(SparseAttentionTest, AllBucketsMatchingEqualsDenseCausalAttentionAndItsGradients) {
  torch::manual_seed(1);
  for (int64_t t : {32, 29}) {  // 29: the last block is padded
    torch::Tensor q = torch::randn({6, t, 8}, torch::requires_grad());
    torch::Tensor k = torch::randn({6, t, 8}, torch::requires_grad());
    torch::Tensor v = torch::randn({6, t, 8}, torch::requires_grad());
    const int64_t nb = (t + 7) / 8;
    torch::Tensor zeros = torch::zeros({1, 6, nb}, torch::kLong);
    BlockPairs all = SelectBlockPairs(zeros, zeros);
    EXPECT_EQ(all.count(), 6 * nb * (nb + 1) / 2);
    torch::Tensor sparse = BlockSparseAttention(q, k, v, all, 8, 1.0 / std::sqrt(8.0));
    torch::Tensor dense = DenseCausal(q, k, v);
    EXPECT_TRUE(torch::allclose(sparse, dense, 1e-5, 1e-5)) << "t=" << t;
    torch::Tensor w = torch::randn_like(dense);
    auto grads = [&](const torch::Tensor& y) {
      return torch::autograd::grad({(y * w).sum()}, {q, k, v});
    };
    std::vector<torch::Tensor> gs = grads(sparse), gd = grads(dense);
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(torch::allclose(gs[i], gd[i], 1e-4, 1e-5)) << "t=" << t << " grad " << i;
    }
  }
}

TEST(SparseAttentionTest, OneBucketLayerEqualsTheDenseAttentionLayerWithTheSameWeights) {
  ModelConfig m;
  m.hidden = 16;
  m.heads = 2;
  m.seq_len = 24;
  m.dynamism.cases = {"sparse-attention"};
  m.dynamism.attention_block = 8;
  m.dynamism.attention_buckets = 1;
  torch::manual_seed(9);
  DenseAttention dense(m);
  torch::manual_seed(9);  // same draws: qkv, then the output projection
  HashSparseAttention sparse(m);
  torch::Tensor x = torch::randn({3, 24, 16});
  MicroBatchContext ctx;
  // Blockwise and whole-row softmax sum in different orders; float32's
  // rounding then differs by up to a few 1e-6, and by how much depends on
  // the CPU's vector kernels (a CI machine saw more than 1e-6), so the
  // bound is the same as the attention test's above.
  torch::Tensor ys = sparse.Forward(x, ctx), yd = dense.Forward(x, ctx);
  EXPECT_TRUE(torch::allclose(ys, yd, 1e-5, 1e-5))
      << "largest difference " << (ys - yd).abs().max().item<float>();
  EXPECT_EQ(sparse.last_attended_pairs(), sparse.last_dense_pairs());
}

TEST(SparseAttentionTest, MatchesTheCpuReferenceKernelOnRandomBuckets) {
  torch::manual_seed(2);
  const int64_t heads = 4, t = 40, d = 8, block = 8, nb = 5;
  torch::Tensor q = torch::randn({heads, t, d}), k = torch::randn({heads, t, d}),
                v = torch::randn({heads, t, d});
  torch::Tensor qb = torch::randint(0, 3, {1, heads, nb}, torch::kLong);
  torch::Tensor kb = torch::randint(0, 3, {1, heads, nb}, torch::kLong);
  BlockPairs pairs = SelectBlockPairs(qb, kb);
  torch::Tensor ours = BlockSparseAttention(q, k, v, pairs, block, 1.0 / std::sqrt(8.0));

  std::vector<int32_t> q32(qb.numel()), k32(kb.numel());
  for (int64_t i = 0; i < qb.numel(); ++i) {
    q32[i] = static_cast<int32_t>(qb.view({-1})[i].item<int64_t>());
    k32[i] = static_cast<int32_t>(kb.view({-1})[i].item<int64_t>());
  }
  kernels::AttentionShape shape{heads, t, d, block};
  std::vector<float> out(heads * t * d);
  auto span = [](const torch::Tensor& x) {
    return absl::Span<const float>(x.data_ptr<float>(), x.numel());
  };
  absl::StatusOr<int64_t> count = kernels::BlockSparseCausalAttention(
      shape, span(q), span(k), span(v), q32, k32, 1.0f / std::sqrt(8.0f),
      absl::MakeSpan(out));
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, pairs.count());
  torch::Tensor reference = torch::from_blob(out.data(), {heads, t, d}).clone();
  EXPECT_TRUE(torch::allclose(ours, reference, 1e-5, 1e-5));
}

TEST(SparseAttentionTest, FewerMatchingBucketsComputeFewerBlockPairs) {
  torch::manual_seed(4);
  const int64_t bh = 8, t = 1024, d = 16, block = 32, nb = t / block;
  torch::Tensor q = torch::randn({bh, t, d}, torch::requires_grad());
  torch::Tensor k = torch::randn({bh, t, d}, torch::requires_grad());
  torch::Tensor v = torch::randn({bh, t, d}, torch::requires_grad());
  std::vector<int64_t> cyclic(nb);
  for (int64_t i = 0; i < nb; ++i) cyclic[i] = i % 8;
  BlockPairs dense = SelectBlockPairs(Buckets(bh, std::vector<int64_t>(nb, 0)),
                                      Buckets(bh, std::vector<int64_t>(nb, 0)));
  BlockPairs sparse = SelectBlockPairs(Buckets(bh, cyclic), Buckets(bh, cyclic));
  EXPECT_EQ(dense.count(), bh * nb * (nb + 1) / 2);  // 4224
  EXPECT_EQ(sparse.count(), bh * (nb + (nb / 8) * (nb / 8 - 1) / 2 * 8));  // 8·(32+48)
  // The time this saves is measured by bench/ (dynmo-bench-dynamism), never
  // asserted here: both selections run forward and backward.
  for (const BlockPairs* p : {&dense, &sparse}) {
    torch::Tensor y = BlockSparseAttention(q, k, v, *p, block, 0.25);
    y.sum().backward();
    EXPECT_EQ(y.sizes(), q.sizes());
  }
}

TEST(SparseAttentionTest, MoreBucketsShrinkTheLayersAttendedBlocks) {
  ModelConfig m;
  m.hidden = 32;
  m.heads = 4;
  m.seq_len = 256;
  m.dynamism.cases = {"sparse-attention"};
  m.dynamism.attention_block = 16;
  torch::Tensor x = torch::randn({2, 256, 32});
  MicroBatchContext ctx;
  int64_t previous = std::numeric_limits<int64_t>::max();
  for (int buckets : {1, 2, 8}) {
    m.dynamism.attention_buckets = buckets;
    torch::manual_seed(12);
    HashSparseAttention layer(m);
    torch::Tensor y = layer.Forward(x, ctx);
    EXPECT_EQ(y.sizes(), x.sizes());
    EXPECT_LT(layer.last_attended_pairs(), previous) << buckets << " buckets";
    EXPECT_GE(layer.last_attended_pairs(), 2 * 4 * 16) << "the diagonal is always attended";
    previous = layer.last_attended_pairs();
  }
}

}  // namespace
}  // namespace dynmo::trainer
