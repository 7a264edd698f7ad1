// Dynamic sparse attention (--dynamism=sparse-attention, the paper's §2.2
// fourth case), hash based after Pagliardini et al. ("Fast attention over
// long sequences"): causal attention computed only between the blocks of
// queries and keys whose hash buckets match.
//
// The sequence is cut into blocks of `attention_block` tokens (the last
// one padded). Per head and hash round, a block's bucket is the argmax of
// its mean query (mean key) projected on `attention_buckets` random
// directions (a fixed buffer drawn with the layer's weights, so it
// travels with the layer). Query block qb attends key block kb when
// kb == qb (the diagonal, with the token-level causal mask), or kb < qb and
// their buckets agree in some round. As queries and keys train, the buckets
// move, so the work of each layer changes with its own hashing.
//
// Only the selected (query block, key block) pairs are computed: they are
// gathered into a batch, multiplied, soft-maxed across all the blocks a
// query row attends (a segmented log-sum-exp), and summed back — the same
// rule as kernels/block_sparse_attention_cpu.h, but in LibTorch ops so it
// is differentiable. A layer with fewer matches does proportionally less
// work. Not thread-safe; owned by the rank's training thread.
#ifndef DYNMO_TRAINER_MODEL_SPARSE_ATTENTION_H_
#define DYNMO_TRAINER_MODEL_SPARSE_ATTENTION_H_

#include <torch/torch.h>

#include <cstdint>

#include "trainer/config/config.h"
#include "trainer/model/decoder_block.h"

namespace dynmo::trainer {

// The attended block pairs of G = BH·nb query blocks.
struct BlockPairs {
  torch::Tensor query_block;  // [P] int64: bh·nb + qb
  torch::Tensor key_block;    // [P] int64: bh·nb + kb
  torch::Tensor diagonal;     // [P] bool: kb == qb
  int64_t count() const { return query_block.numel(); }
};

// Pairs selected by buckets `q_buckets`, `k_buckets` [R, BH, nb] (int64):
// the diagonal plus every kb < qb that shares a bucket with qb in a round.
BlockPairs SelectBlockPairs(const torch::Tensor& q_buckets,
                            const torch::Tensor& k_buckets);

// Causal attention of q, k, v [BH, T, d] over `pairs` of blocks of `block`
// tokens: returns [BH, T, d]. Differentiable in q, k and v.
torch::Tensor BlockSparseAttention(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v, const BlockPairs& pairs,
                                   int64_t block, double scale);

// Buckets [R, BH, nb] of the per-block means of x [B, heads, T, d] under
// `rotations` [R, heads, d, buckets]: argmax of the projections.
torch::Tensor HashBlocks(const torch::Tensor& x, const torch::Tensor& rotations,
                         int64_t block);

class HashSparseAttention : public BlockPart {
 public:
  explicit HashSparseAttention(const ModelConfig& m);
  torch::Tensor Forward(const torch::Tensor& x, MicroBatchContext& ctx) override;

  // Block pairs the last Forward computed, and a dense causal attention's
  // count for the same shape (BH · nb(nb+1)/2).
  int64_t last_attended_pairs() const { return last_attended_pairs_; }
  int64_t last_dense_pairs() const { return last_dense_pairs_; }

 private:
  int64_t heads_;
  int64_t block_;
  torch::nn::Linear qkv_;
  torch::nn::Linear attention_out_;
  torch::Tensor rotations_;  // [rounds, heads, d, buckets]
  int64_t last_attended_pairs_ = 0;
  int64_t last_dense_pairs_ = 0;
};

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_MODEL_SPARSE_ATTENTION_H_
