// DecoderBlock: one pre-LayerNorm GPT decoder block (pipeline layers
// 1..N), split into replaceable parts so the dynamic-model schemes can swap
// what a block computes without touching the block itself:
//
//   h   = x + attention(ln_attention(x))
//   out = h + mlp(ln_mlp(h))
//
// `attention` is a BlockPart (dense causal attention by default; hash-based
// sparse attention under --dynamism=sparse-attention), `mlp` is a BlockPart
// (dense GELU MLP by default; a Mixture of Experts under --dynamism=moe).
// A DepthRouter (--dynamism=mod) may wrap the whole residual pair so that
// only the tokens it picks run through the block.
//
// Initialisation: MakeDecoderBlock (make_layer.h) builds the parts in a fixed order
// (attention, then MLP, then the router), so a block's initial weights
// depend only on the global generator's state at entry, which MakeLayer
// seeds from (seed, id). Parameter names are "ln_attention.*",
// "attention.*", "ln_mlp.*", "mlp.*" (and "depth_router.*").
// Modules are not thread-safe; one rank's thread owns its layers.
#ifndef DYNMO_TRAINER_MODEL_DECODER_BLOCK_H_
#define DYNMO_TRAINER_MODEL_DECODER_BLOCK_H_

#include <torch/torch.h>

#include <functional>
#include <memory>

#include "trainer/config/config.h"
#include "trainer/model/early_exit.h"
#include "trainer/model/gpt_layers.h"
#include "trainer/model/prunable_linear.h"

namespace dynmo::trainer {

// A replaceable sub-layer of a block: [B, T, H] normalised hidden states to
// [B, T, H] (the residual branch, without the residual).
class BlockPart : public torch::nn::Module {
 public:
  virtual torch::Tensor Forward(const torch::Tensor& x, MicroBatchContext& ctx) = 0;
  // Early exit: the branch's output [n, H] for the `active` tokens only,
  // given every token's input x [B, T, H] (exited ones as keys/values). The
  // default runs Forward on all tokens and gathers; parts that can do less
  // work override it (model/early_exit.h).
  virtual torch::Tensor ForwardActive(const torch::Tensor& x, const ActiveTokens& active,
                                      MicroBatchContext& ctx) {
    return Forward(x, ctx).reshape({-1, x.size(2)}).index_select(0, active.flat);
  }
};

// Dense causal multi-head self-attention: qkv projection, softmax attention
// under a causal mask, output projection.
// Its two projections are PrunableLinear (--dynamism=pruning prunes them;
// without it they are plain nn::Linear in all but type).
class DenseAttention : public BlockPart {
 public:
  explicit DenseAttention(const ModelConfig& m);
  torch::Tensor Forward(const torch::Tensor& x, MicroBatchContext& ctx) override;
  // Queries of the active tokens only; keys and values of all.
  torch::Tensor ForwardActive(const torch::Tensor& x, const ActiveTokens& active,
                              MicroBatchContext& ctx) override;
  PrunableLinear& qkv() { return qkv_; }
  PrunableLinear& out() { return attention_out_; }

 private:
  int64_t heads_;
  PrunableLinear qkv_;
  PrunableLinear attention_out_;
  torch::Tensor causal_mask_;
};

// Dense GELU MLP: H -> 4H -> H. Both projections are PrunableLinear.
class DenseMlp : public BlockPart {
 public:
  explicit DenseMlp(const ModelConfig& m);
  torch::Tensor Forward(const torch::Tensor& x, MicroBatchContext& ctx) override;
  PrunableLinear& in() { return mlp_in_; }
  PrunableLinear& out() { return mlp_out_; }

 private:
  PrunableLinear mlp_in_;
  PrunableLinear mlp_out_;
};

// Wraps a block's residual pair: given the block input x [B, T, H] and
// `body` (the block as a function of a [B, T', H] token subset, returning
// the block's output on it), returns the block's output [B, T, H].
class DepthRouter : public torch::nn::Module {
 public:
  using Body = std::function<torch::Tensor(const torch::Tensor&)>;
  virtual torch::Tensor Route(const torch::Tensor& x, MicroBatchContext& ctx,
                              const Body& body) = 0;
};

class DecoderBlock : public PipelineLayer {
 public:
  // `router` may be null (every token runs through the block).
  DecoderBlock(int id, const ModelConfig& m, std::shared_ptr<BlockPart> attention,
               std::shared_ptr<BlockPart> mlp, std::shared_ptr<DepthRouter> router);

  torch::Tensor Forward(const torch::Tensor& x, MicroBatchContext& ctx) override;
  // The residual pair on every token of x (no depth routing).
  torch::Tensor Body(const torch::Tensor& x, MicroBatchContext& ctx);

  BlockPart& attention() { return *attention_; }
  BlockPart& mlp() { return *mlp_; }
  DepthRouter* depth_router() { return router_.get(); }
  // Early exit: makes this block an exit point (registered as "exit_head").
  void SetExitHead(std::shared_ptr<EarlyExitHead> head);
  EarlyExitHead* exit_head() { return exit_head_.get(); }

 private:
  torch::nn::LayerNorm ln_attention_;
  std::shared_ptr<BlockPart> attention_;
  torch::nn::LayerNorm ln_mlp_;
  std::shared_ptr<BlockPart> mlp_;
  std::shared_ptr<DepthRouter> router_;
  std::shared_ptr<EarlyExitHead> exit_head_;
  // Early exit: the residual pair on ctx.token_active's tokens only; the
  // others are copied through.
  torch::Tensor ActiveBody(const torch::Tensor& x, MicroBatchContext& ctx);
};

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_MODEL_DECODER_BLOCK_H_
