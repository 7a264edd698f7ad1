// Early exit (CALM, Schuster et al. 2022), the layer side: which tokens are
// still in flight, the block computed on those tokens only, and the exit
// points that decide who leaves.
//
// A micro-batch's MicroBatchContext::token_active ([B, T] bool) marks the
// tokens in flight; undefined means all of them (so a block with nothing
// exited yet takes its dense path, and pp=1 and pp=2 take the same path).
// From the first exit point on (DynamismConfig::early_exit.after), a block
// gathers the active tokens [n, H] and runs on them: LayerNorm, attention
// output projection, MLP and the residuals cost n tokens, not B·T. Attention
// keeps the causal structure: an active token's query attends over the keys
// and values of every earlier-or-same position of its sequence, where an
// exited token's hidden state is its frozen copy (CALM's state propagation).
// So, as in CALM, an exited token costs only its key and value projections
// (2H² of the block's ~12H² per token); queries, attention and everything
// after cost the n tokens in flight. Exited tokens' hidden states are copied
// through, and the head predicts them from their exit state.
//
// An exit point (blocks after..N-1) is an EarlyExitHead: LayerNorm + a
// bias-free H → vocab projection, applied to the tokens in flight after
// the block. Its cross-entropy against ctx.targets (weighted loss_weight)
// is the block's auxiliary loss (ctx.aux_losses), which trains the head and
// pushes the intermediate states to be predictive, as CALM's weighted
// per-layer losses do. The confidence is CALM's softmax response: the top
// probability of that same head (detached); a token exits when it is at
// least `threshold`. The final LM head lives on the last stage, so each exit
// point has its own head: the cost is H·vocab per token in flight.
//
// Not thread-safe (modules belong to the rank's training thread).
#ifndef DYNMO_TRAINER_MODEL_EARLY_EXIT_H_
#define DYNMO_TRAINER_MODEL_EARLY_EXIT_H_

#include <torch/torch.h>

#include <cstdint>
#include <utility>

#include "trainer/config/config.h"
#include "trainer/model/gpt_layers.h"
#include "trainer/model/token_subset.h"

namespace dynmo::trainer {

// The tokens in flight of a [B, T] mask (SelectTokens(mask)).
using ActiveTokens = TokenSubset;

// Causal attention of the active tokens' queries q [n, heads, d] over every
// token's keys and values k, v [B, heads, T, d]: token (b, t) sees positions
// <= t of sample b. Returns [n, heads·d]. Runs on the packed layout
// (token_subset.h), so the work is B·width·T·d per head, ≈ n·T·d when the
// tokens in flight are spread evenly over the sequences; k and v are read
// in place, never copied per query.
torch::Tensor ActiveCausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, const ActiveTokens& active);

// One exit point. Counters (tokens seen / exited since TakeCounts) feed the
// stage-level monitor (early_exit_profile.h); they are not layer state.
class EarlyExitHead : public torch::nn::Module {
 public:
  explicit EarlyExitHead(const ModelConfig& m);
  // `out` [B, T, H] is the block's output for ctx's tokens in flight: adds
  // the exit loss to ctx.aux_losses and clears the exiting tokens from
  // ctx.token_active (undefined again when nobody exited).
  void Decide(const torch::Tensor& out, MicroBatchContext& ctx);
  // (tokens that reached this exit point, tokens that exited here).
  std::pair<int64_t, int64_t> TakeCounts();

 private:
  double threshold_;
  double loss_weight_;
  int warmup_iters_;
  torch::nn::LayerNorm ln_;
  torch::nn::Linear proj_;
  int64_t seen_ = 0;
  int64_t exited_ = 0;
};

// The mask on the wire between stages: [B, T] uint8, all ones (made on
// `device`, so no copy from host memory) when `active` is undefined; and
// back (undefined again when all ones).
torch::Tensor TokenMaskToWire(const torch::Tensor& active, int64_t b, int64_t t,
                              torch::Device device = torch::kCPU);
torch::Tensor TokenMaskFromWire(const torch::Tensor& wire);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_MODEL_EARLY_EXIT_H_
