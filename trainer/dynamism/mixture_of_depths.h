// Mixture of Depths (--dynamism=mod, the paper's §2.2 sixth case; Raposo
// et al. 2024): expert-choice routing around a whole decoder block.
//
// Training: a bias-free linear router scores every token; per sequence the
// top k = max(1, round(mod_capacity · T)) tokens (kept in their causal
// order) are gathered and run through the block — attention among them
// only, MLP on them only — and the rest skip it on the residual. A routed
// token's output is x + σ(score) · (block(x) − x), so the router is trained
// through the main loss. Next to it, a small MLP predictor (H → H → 1, on
// the detached block input) learns with BCE which tokens the router put in
// the top-k (the weighted loss goes to ctx.aux_losses): top-k over a whole
// sequence is not causal, the predictor is. Outside training (eval mode)
// tokens whose predictor logit is > 0 run through the block instead.
//
// A MoD block's work is that of k tokens, not T: the gather is real.
// Not thread-safe; owned by the rank's training thread.
#ifndef DYNMO_TRAINER_DYNAMISM_MIXTURE_OF_DEPTHS_H_
#define DYNMO_TRAINER_DYNAMISM_MIXTURE_OF_DEPTHS_H_

#include <torch/torch.h>

#include <cstdint>

#include "trainer/config.h"
#include "trainer/decoder_block.h"

namespace dynmo::trainer {

// Tokens a MoD block runs per sequence of `seq_len`: max(1, round(c·T)).
int64_t ModTokens(double capacity, int64_t seq_len);

class MixtureOfDepthsRouter : public DepthRouter {
 public:
  explicit MixtureOfDepthsRouter(const ModelConfig& m);
  torch::Tensor Route(const torch::Tensor& x, MicroBatchContext& ctx,
                      const Body& body) override;

  torch::nn::Linear& router() { return router_; }
  // The predictor's logits for x [B, T, H] -> [B, T].
  torch::Tensor PredictorLogits(const torch::Tensor& x);
  // [B, k] int64, ascending: the tokens the last training Forward routed.
  const torch::Tensor& last_selected() const { return last_selected_; }

 private:
  double capacity_;
  double predictor_loss_weight_;
  torch::nn::Linear router_;
  torch::nn::Linear predictor_in_;
  torch::nn::Linear predictor_out_;
  torch::Tensor last_selected_;
};

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_DYNAMISM_MIXTURE_OF_DEPTHS_H_
