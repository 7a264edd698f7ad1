#include "trainer/model/decoder_block.h"

#include <cmath>
#include <limits>
#include <utility>


namespace dynmo::trainer {
namespace {

namespace nn = torch::nn;
namespace F = torch::nn::functional;

// --dynamism=pruning makes the block's four weight matrices prunable.
bool Prunable(const ModelConfig& m) { return m.dynamism.Has("pruning"); }

}  // namespace

DenseAttention::DenseAttention(const ModelConfig& m)
    : heads_(m.heads),
      qkv_(register_module("qkv", PrunableLinear(m.hidden, 3 * m.hidden, Prunable(m)))),
      attention_out_(register_module("attention_out",
                                     PrunableLinear(m.hidden, m.hidden, Prunable(m)))) {
  // Future positions are masked; a buffer so it travels with the layer.
  causal_mask_ = register_buffer(
      "causal_mask", torch::triu(torch::ones({m.seq_len, m.seq_len}, torch::kBool), 1));
}

torch::Tensor DenseAttention::Forward(const torch::Tensor& x, MicroBatchContext&) {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
  const int64_t d = c / heads_;
  std::vector<torch::Tensor> qkv = qkv_(x).split(c, /*dim=*/2);
  auto heads = [&](const torch::Tensor& y) {
    return y.view({b, t, heads_, d}).transpose(1, 2);  // [B, nh, T, d]
  };
  torch::Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  torch::Tensor scores = q.matmul(k.transpose(-2, -1)) * (1.0 / std::sqrt(double(d)));
  using torch::indexing::Slice;
  scores = scores.masked_fill(causal_mask_.index({Slice(0, t), Slice(0, t)}),
                              -std::numeric_limits<float>::infinity());
  torch::Tensor y = torch::softmax(scores, -1).matmul(v);
  return attention_out_(y.transpose(1, 2).contiguous().view({b, t, c}));
}

torch::Tensor DenseAttention::ForwardActive(const torch::Tensor& x,
                                            const ActiveTokens& active,
                                            MicroBatchContext&) {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
  const int64_t d = c / heads_;
  // CALM: every token's keys and values (an exited token's from its frozen
  // state), the queries of the tokens in flight only: rows [H, 3H) of the
  // qkv projection over B·T tokens, rows [0, H) over n.
  const std::vector<torch::Tensor> kv = qkv_->ForwardRows(x, c, 2 * c).split(c, /*dim=*/2);
  const torch::Tensor q =
      qkv_->ForwardRows(x.reshape({b * t, c}).index_select(0, active.flat), 0, c);
  auto heads = [&](const torch::Tensor& y) {
    return y.view({b, t, heads_, d}).transpose(1, 2);  // [B, nh, T, d]
  };
  const torch::Tensor y =
      ActiveCausalAttention(q.view({-1, heads_, d}), heads(kv[0]), heads(kv[1]), active);
  return attention_out_(y.unsqueeze(0)).squeeze(0);  // [1, n, H]: any projection
}

DenseMlp::DenseMlp(const ModelConfig& m)
    : mlp_in_(register_module("mlp_in", PrunableLinear(m.hidden, 4 * m.hidden, Prunable(m)))),
      mlp_out_(register_module("mlp_out", PrunableLinear(4 * m.hidden, m.hidden, Prunable(m)))) {}

torch::Tensor DenseMlp::Forward(const torch::Tensor& x, MicroBatchContext&) {
  return mlp_out_(F::gelu(mlp_in_(x)));
}

DecoderBlock::DecoderBlock(int id, const ModelConfig& m,
                           std::shared_ptr<BlockPart> attention,
                           std::shared_ptr<BlockPart> mlp,
                           std::shared_ptr<DepthRouter> router)
    : PipelineLayer(id, LayerKind::kBlock),
      ln_attention_(register_module("ln_attention",
                                    nn::LayerNorm(nn::LayerNormOptions({m.hidden})))),
      attention_(register_module("attention", std::move(attention))),
      ln_mlp_(register_module("ln_mlp", nn::LayerNorm(nn::LayerNormOptions({m.hidden})))),
      mlp_(register_module("mlp", std::move(mlp))) {
  if (router != nullptr) router_ = register_module("depth_router", std::move(router));
}

torch::Tensor DecoderBlock::Body(const torch::Tensor& x, MicroBatchContext& ctx) {
  torch::Tensor h = x + attention_->Forward(ln_attention_(x), ctx);
  return h + mlp_->Forward(ln_mlp_(h), ctx);
}

torch::Tensor DecoderBlock::Forward(const torch::Tensor& x, MicroBatchContext& ctx) {
  torch::Tensor out;
  if (ctx.token_active.defined()) {
    out = ActiveBody(x, ctx);  // early exit: some tokens left already
  } else if (router_ == nullptr) {
    out = Body(x, ctx);
  } else {
    out = router_->Route(x, ctx, [&](const torch::Tensor& xs) { return Body(xs, ctx); });
  }
  if (exit_head_ != nullptr) exit_head_->Decide(out, ctx);
  return out;
}

torch::Tensor DecoderBlock::ActiveBody(const torch::Tensor& x, MicroBatchContext& ctx) {
  const ActiveTokens active = SelectTokens(ctx.token_active);
  const torch::Tensor rows = x.reshape({-1, x.size(2)});
  if (active.count() == 0) return x.clone();
  // Every token's normalised state feeds the keys and values.
  torch::Tensor h = rows.index_select(0, active.flat) +
                    attention_->ForwardActive(ln_attention_(x), active, ctx);
  h = h + mlp_->Forward(ln_mlp_(h).unsqueeze(0), ctx).squeeze(0);
  return rows.index_copy(0, active.flat, h).view_as(x);
}

void DecoderBlock::SetExitHead(std::shared_ptr<EarlyExitHead> head) {
  exit_head_ = register_module("exit_head", std::move(head));
}

}  // namespace dynmo::trainer
