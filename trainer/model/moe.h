// Mixture of Experts (--dynamism=moe, the paper's §2.2 first case): a
// block's MLP replaced by E expert MLPs behind a softmax router with top-2
// token-choice routing (GShard / Mixtral style).
//
//   probs  = softmax(router(x))                  [N, E], N = B·T tokens
//   top-2 experts per token, their gates renormalised to sum to 1
//   capacity C = ceil(capacity_factor · N · 2 / E) assignments per expert;
//   first choices are placed before second choices, each in token order,
//   and assignments beyond C are dropped (the token's residual carries it)
//   y[n]   = Σ over its kept assignments  gate · expert(x[n])
//   aux    = weight · E · Σ_e f_e · P_e      (f_e: share of the 2N top-2
//            assignments to e before dropping, P_e: mean router prob of e)
//
// Every expert runs on exactly the tokens it received (index_select, then
// index_add back), so a MoE block's cost follows its real routing. The
// weighted auxiliary loss is appended to ctx.aux_losses.
// Not thread-safe; owned by the rank's training thread.
#ifndef DYNMO_TRAINER_MODEL_MOE_H_
#define DYNMO_TRAINER_MODEL_MOE_H_

#include <torch/torch.h>

#include <vector>

#include "trainer/config/config.h"
#include "trainer/model/decoder_block.h"

namespace dynmo::trainer {

// Where top-2 routing sends N tokens among E experts.
struct MoeRouting {
  torch::Tensor experts;  // [N, 2] int64: first and second choice
  torch::Tensor gates;    // [N, 2] float: renormalised top-2 probabilities
  torch::Tensor kept;     // [N, 2] bool: within the expert's capacity
  // Per expert: the tokens it runs (int64, ascending within each choice
  // rank: first choices first) and the matching gates, [n_e].
  std::vector<torch::Tensor> tokens;
  std::vector<torch::Tensor> token_gates;
  // On the device, so routing reads nothing back for its statistics:
  torch::Tensor assigned;  // [E] int64: per expert, before capacity
  torch::Tensor dropped;   // [] int64: assignments beyond capacity
};

// C = ceil(capacity_factor · tokens · 2 / experts), at least 1.
int64_t MoeCapacity(double capacity_factor, int64_t tokens, int64_t experts);

// Top-2 routing of `probs` [N, E] (rows sum to 1) under `capacity`.
// `gates` keep the autograd graph of `probs`.
MoeRouting RouteTopTwo(const torch::Tensor& probs, int64_t capacity);

// E · Σ_e f_e · P_e (unweighted) for `probs` [N, E] and its routing.
torch::Tensor MoeBalanceLoss(const torch::Tensor& probs, const MoeRouting& routing);

class MoeMlp : public BlockPart {
 public:
  explicit MoeMlp(const ModelConfig& m);
  torch::Tensor Forward(const torch::Tensor& x, MicroBatchContext& ctx) override;

  torch::nn::Linear& router() { return router_; }
  DenseMlp& expert(int e) { return *experts_[e]; }
  int num_experts() const { return static_cast<int>(experts_.size()); }
  // The routing of the last Forward (tests, logs).
  const MoeRouting& last_routing() const { return last_routing_; }

 private:
  double capacity_factor_;
  double aux_loss_weight_;
  torch::nn::Linear router_;
  std::vector<std::shared_ptr<DenseMlp>> experts_;
  MoeRouting last_routing_;
};

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_MODEL_MOE_H_
