#include "trainer/model/sparse_attention.h"

#include <cmath>
#include <limits>
#include <vector>

namespace dynmo::trainer {
namespace {

// x [BH, T, d] zero-padded to [BH, nb·block, d].
torch::Tensor PadToBlocks(const torch::Tensor& x, int64_t block) {
  const int64_t t = x.size(1);
  const int64_t padded = (t + block - 1) / block * block;
  if (padded == t) return x;
  return torch::constant_pad_nd(x, {0, 0, 0, padded - t});
}

}  // namespace

BlockPairs SelectBlockPairs(const torch::Tensor& q_buckets,
                            const torch::Tensor& k_buckets) {
  const int64_t nb = q_buckets.size(2);
  // [BH, nb(q), nb(k)]: some round agrees.
  torch::Tensor match = (q_buckets.unsqueeze(3) == k_buckets.unsqueeze(2)).any(0);
  const auto flags = match.options().dtype(torch::kBool);
  torch::Tensor below = torch::tril(torch::ones({nb, nb}, flags), -1);
  torch::Tensor diag = torch::eye(nb, flags);
  torch::Tensor attended = (match & below) | diag;
  // host-sync(model): per sparse-attention layer and micro-batch: the attended blocks index the
  //   block-sparse product (their count is a dynamic shape)
  torch::Tensor idx = torch::nonzero(attended);  // [P, 3]: bh, qb, kb (row-major)
  torch::Tensor b = idx.select(1, 0), qb = idx.select(1, 1), kb = idx.select(1, 2);
  BlockPairs pairs;
  pairs.query_block = b * nb + qb;
  pairs.key_block = b * nb + kb;
  pairs.diagonal = qb == kb;
  return pairs;
}

torch::Tensor BlockSparseAttention(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v, const BlockPairs& pairs,
                                   int64_t block, double scale) {
  const int64_t bh = q.size(0), t = q.size(1), d = q.size(2);
  torch::Tensor qp = PadToBlocks(q, block), kp = PadToBlocks(k, block),
                vp = PadToBlocks(v, block);
  const int64_t nb = qp.size(1) / block;
  const int64_t groups = bh * nb;
  const int64_t p = pairs.count();
  auto blocks = [&](const torch::Tensor& x) { return x.reshape({groups, block, d}); };
  torch::Tensor qs = blocks(qp).index_select(0, pairs.query_block);  // [P, bs, d]
  torch::Tensor ks = blocks(kp).index_select(0, pairs.key_block);
  torch::Tensor vs = blocks(vp).index_select(0, pairs.key_block);
  torch::Tensor scores = torch::bmm(qs, ks.transpose(1, 2)) * scale;  // [P, bs, bs]
  // Token-level causal mask inside diagonal blocks; padded keys only ever
  // sit in the last block, which is attended only as a diagonal, behind
  // every real query of it.
  torch::Tensor future = torch::triu(torch::ones({block, block}, q.options().dtype(torch::kBool)), 1);
  scores = scores.masked_fill(pairs.diagonal.view({p, 1, 1}) & future,
                              -std::numeric_limits<float>::infinity());
  // Softmax across every block a query row attends: a constant shift per
  // row (its max, no gradient needed) then segmented sums.
  torch::Tensor row_max = std::get<0>(scores.max(-1)).detach();  // [P, bs]
  torch::Tensor index = pairs.query_block.unsqueeze(1).expand({p, block}).contiguous();
  torch::Tensor group_max =
      torch::full({groups, block}, -std::numeric_limits<float>::infinity(), row_max.options())
          .scatter_reduce(0, index, row_max, "amax", /*include_self=*/true);
  torch::Tensor weights =
      torch::exp(scores - group_max.index_select(0, pairs.query_block).unsqueeze(-1));
  torch::Tensor denom =
      torch::zeros({groups, block}, weights.options()).index_add(0, pairs.query_block, weights.sum(-1));
  torch::Tensor numer = torch::zeros({groups, block, d}, weights.options())
                            .index_add(0, pairs.query_block, torch::bmm(weights, vs));
  torch::Tensor out = (numer / denom.unsqueeze(-1)).reshape({bh, nb * block, d});
  using torch::indexing::Slice;
  return out.index({Slice(), Slice(0, t), Slice()});
}

torch::Tensor HashBlocks(const torch::Tensor& x, const torch::Tensor& rotations,
                         int64_t block) {
  torch::NoGradGuard no_grad;
  const int64_t b = x.size(0), heads = x.size(1), t = x.size(2), d = x.size(3);
  torch::Tensor padded = PadToBlocks(x.reshape({b * heads, t, d}), block);
  const int64_t nb = padded.size(1) / block;
  torch::Tensor means = padded.view({b, heads, nb, block, d}).mean(3);  // [B, h, nb, d]
  // [R, B, h, nb, buckets]
  torch::Tensor proj = torch::einsum("bhnd,rhdk->rbhnk", {means, rotations});
  return proj.argmax(-1).reshape({rotations.size(0), b * heads, nb});
}

HashSparseAttention::HashSparseAttention(const ModelConfig& m)
    : heads_(m.heads),
      block_(m.dynamism.attention_block),
      qkv_(register_module("qkv", torch::nn::Linear(m.hidden, 3 * m.hidden))),
      attention_out_(
          register_module("attention_out", torch::nn::Linear(m.hidden, m.hidden))) {
  // Drawn after the projections, so they start as the dense block's do.
  rotations_ = register_buffer(
      "hash_rotations",
      torch::randn({m.dynamism.attention_hash_rounds, m.heads, m.hidden / m.heads,
                    m.dynamism.attention_buckets}));
}

torch::Tensor HashSparseAttention::Forward(const torch::Tensor& x, MicroBatchContext&) {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
  const int64_t d = c / heads_;
  std::vector<torch::Tensor> qkv = qkv_(x).split(c, /*dim=*/2);
  auto heads = [&](const torch::Tensor& y) {
    return y.view({b, t, heads_, d}).transpose(1, 2);  // [B, nh, T, d]
  };
  torch::Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  BlockPairs pairs =
      SelectBlockPairs(HashBlocks(q, rotations_, block_), HashBlocks(k, rotations_, block_));
  const int64_t nb = (t + block_ - 1) / block_;
  last_attended_pairs_ = pairs.count();
  last_dense_pairs_ = b * heads_ * nb * (nb + 1) / 2;
  auto flat = [&](const torch::Tensor& y) { return y.reshape({b * heads_, t, d}); };
  torch::Tensor y = BlockSparseAttention(flat(q), flat(k), flat(v), pairs, block_,
                                         1.0 / std::sqrt(static_cast<double>(d)));
  return attention_out_(
      y.reshape({b, heads_, t, d}).transpose(1, 2).contiguous().view({b, t, c}));
}

}  // namespace dynmo::trainer
