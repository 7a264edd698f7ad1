#include "trainer/model/gpt_layers.h"


namespace dynmo::trainer {
namespace {

namespace nn = torch::nn;
namespace F = torch::nn::functional;

constexpr double kInitStd = 0.02;  // GPT-2's initialiser

class EmbeddingLayer : public PipelineLayer {
 public:
  EmbeddingLayer(int id, const ModelConfig& m)
      : PipelineLayer(id, LayerKind::kEmbedding),
        tokens_(register_module("tokens", nn::Embedding(m.vocab, m.hidden))),
        positions_(register_module("positions", nn::Embedding(m.seq_len, m.hidden))) {
    torch::NoGradGuard no_grad;
    tokens_->weight.normal_(0.0, kInitStd);
    positions_->weight.normal_(0.0, kInitStd);
  }

  torch::Tensor Forward(const torch::Tensor& tokens, MicroBatchContext&) override {
    const int64_t t = tokens.size(1);
    return tokens_(tokens) + positions_(torch::arange(t, tokens.options())).unsqueeze(0);
  }

 private:
  nn::Embedding tokens_;
  nn::Embedding positions_;
};

class HeadLayer : public PipelineLayer {
 public:
  HeadLayer(int id, const ModelConfig& m)
      : PipelineLayer(id, LayerKind::kHead),
        ln_final_(register_module("ln_final", nn::LayerNorm(nn::LayerNormOptions({m.hidden})))),
        lm_head_(register_module(
            "lm_head", nn::Linear(nn::LinearOptions(m.hidden, m.vocab).bias(false)))) {}

  torch::Tensor Forward(const torch::Tensor& x, MicroBatchContext& ctx) override {
    torch::Tensor logits = lm_head_(ln_final_(x));
    return F::cross_entropy(logits.view({-1, logits.size(-1)}), ctx.targets.view({-1}));
  }

 private:
  nn::LayerNorm ln_final_;
  nn::Linear lm_head_;
};

}  // namespace

std::shared_ptr<PipelineLayer> MakeEmbeddingLayer(const ModelConfig& model, int id) {
  return std::make_shared<EmbeddingLayer>(id, model);
}

std::shared_ptr<PipelineLayer> MakeHeadLayer(const ModelConfig& model, int id) {
  return std::make_shared<HeadLayer>(id, model);
}

}  // namespace dynmo::trainer
