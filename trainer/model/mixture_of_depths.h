// Mixture of Depths (--dynamism=mod, the paper's §2.2 sixth case; Raposo
// et al. 2024): expert-choice routing around a whole decoder block.
//
// A bias-free linear router scores every token; the chosen tokens of each
// sequence are gathered (in causal order) and run through the block —
// attention among them only, MLP on them only — and the rest skip it on the
// residual. A routed token's output is x + σ(score) · (block(x) − x), so the
// router is trained through the main loss. Next to it, a small MLP predictor
// (H → H → 1, on the detached block input) learns with BCE which tokens are
// in the router's top k = max(1, round(mod_capacity · T)) per sequence (the
// weighted loss goes to ctx.aux_losses): top-k over a whole sequence is not
// causal, the predictor is. Which tokens are chosen (--mod_routing):
//
//   topk       in training, each sequence's top k: every MoD block runs
//              exactly k tokens per sequence, always (a fixed load).
//   predictor  in training too, the tokens whose predictor logit is > 0:
//              how many varies per sequence and per iteration, and moves
//              toward the capacity fraction as the predictor learns (the
//              paper's variant; the load the balancer sees moves). Its BCE
//              weighs the positives (1 − c)/c, so logit > 0 means
//              P(top-k) > c: it starts near half the tokens and falls
//              toward k, rather than first routing none (the prior).
//
// Outside training (eval mode) both route by the predictor. Sequences with
// different counts are packed [B, width, H] (token_subset.h): real tokens
// first, padding after them, so under the block's causal attention no real
// token sees padding; padded outputs are dropped. (A part that mixes tokens
// otherwise — MoE's expert capacity, hashed sparse attention — would see
// the padding too.)
//
// A MoD block's work is that of the tokens it runs, not T: the gather is
// real. Counters (tokens seen / routed since TakeCounts) feed the stage-level
// load profile (mod_load_profile.h); they are not layer state.
// Not thread-safe; owned by the rank's training thread.
#ifndef DYNMO_TRAINER_MODEL_MIXTURE_OF_DEPTHS_H_
#define DYNMO_TRAINER_MODEL_MIXTURE_OF_DEPTHS_H_

#include <torch/torch.h>

#include <cstdint>
#include <utility>

#include "trainer/config/config.h"
#include "trainer/model/decoder_block.h"
#include "trainer/model/token_subset.h"

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
  // [B, k] int64, ascending: the router's top k of the last training
  // Forward (the tokens it ran under topk routing; the predictor's target).
  const torch::Tensor& last_selected() const { return last_selected_; }
  // Tokens the last Route ran through the block (padding not counted).
  int64_t last_routed() const { return last_routed_; }
  // (tokens that reached the block, tokens it ran) since the last call.
  std::pair<int64_t, int64_t> TakeCounts();

 private:
  double capacity_;
  double predictor_loss_weight_;
  bool by_predictor_;
  torch::nn::Linear router_;
  torch::nn::Linear predictor_in_;
  torch::nn::Linear predictor_out_;
  torch::Tensor last_selected_;
  int64_t last_routed_ = 0;
  int64_t seen_ = 0;
  int64_t routed_ = 0;
};

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_MODEL_MIXTURE_OF_DEPTHS_H_
