#include "trainer/gpt_layers.h"

#include <cmath>
#include <limits>

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

  torch::Tensor Forward(const torch::Tensor& tokens, const torch::Tensor&) override {
    const int64_t t = tokens.size(1);
    return tokens_(tokens) + positions_(torch::arange(t, torch::kLong)).unsqueeze(0);
  }

 private:
  nn::Embedding tokens_;
  nn::Embedding positions_;
};

class DecoderBlock : public PipelineLayer {
 public:
  DecoderBlock(int id, const ModelConfig& m)
      : PipelineLayer(id, LayerKind::kBlock),
        heads_(m.heads),
        ln_attention_(register_module(
            "ln_attention", nn::LayerNorm(nn::LayerNormOptions({m.hidden})))),
        qkv_(register_module("qkv", nn::Linear(m.hidden, 3 * m.hidden))),
        attention_out_(register_module("attention_out", nn::Linear(m.hidden, m.hidden))),
        ln_mlp_(register_module("ln_mlp", nn::LayerNorm(nn::LayerNormOptions({m.hidden})))),
        mlp_in_(register_module("mlp_in", nn::Linear(m.hidden, 4 * m.hidden))),
        mlp_out_(register_module("mlp_out", nn::Linear(4 * m.hidden, m.hidden))) {
    // Future positions are masked; a buffer so it travels with the layer.
    causal_mask_ = register_buffer(
        "causal_mask",
        torch::triu(torch::ones({m.seq_len, m.seq_len}, torch::kBool), 1));
  }

  torch::Tensor Forward(const torch::Tensor& x, const torch::Tensor&) override {
    torch::Tensor h = x + Attention(ln_attention_(x));
    return h + mlp_out_(F::gelu(mlp_in_(ln_mlp_(h))));
  }

 private:
  torch::Tensor Attention(const torch::Tensor& x) {
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

  int64_t heads_;
  nn::LayerNorm ln_attention_;
  nn::Linear qkv_;
  nn::Linear attention_out_;
  nn::LayerNorm ln_mlp_;
  nn::Linear mlp_in_;
  nn::Linear mlp_out_;
  torch::Tensor causal_mask_;
};

class HeadLayer : public PipelineLayer {
 public:
  HeadLayer(int id, const ModelConfig& m)
      : PipelineLayer(id, LayerKind::kHead),
        ln_final_(register_module("ln_final", nn::LayerNorm(nn::LayerNormOptions({m.hidden})))),
        lm_head_(register_module(
            "lm_head", nn::Linear(nn::LinearOptions(m.hidden, m.vocab).bias(false)))) {}

  torch::Tensor Forward(const torch::Tensor& x, const torch::Tensor& targets) override {
    torch::Tensor logits = lm_head_(ln_final_(x));
    return F::cross_entropy(logits.view({-1, logits.size(-1)}), targets.view({-1}));
  }

 private:
  nn::LayerNorm ln_final_;
  nn::Linear lm_head_;
};

}  // namespace

std::shared_ptr<PipelineLayer> MakeLayer(const ModelConfig& model, int id,
                                         uint64_t seed) {
  // Distinct, partition-independent stream per layer.
  torch::manual_seed(seed * 1000003ULL + static_cast<uint64_t>(id));
  if (id == 0) return std::make_shared<EmbeddingLayer>(id, model);
  if (id == model.num_pipeline_layers() - 1) {
    return std::make_shared<HeadLayer>(id, model);
  }
  return std::make_shared<DecoderBlock>(id, model);
}

}  // namespace dynmo::trainer
