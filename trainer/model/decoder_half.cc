#include "trainer/model/decoder_half.h"

#include <utility>

namespace dynmo::trainer {
namespace {

namespace nn = torch::nn;

const char* NormName(DecoderHalf::Part part) {
  return part == DecoderHalf::Part::kAttention ? "ln_attention" : "ln_mlp";
}

}  // namespace

DecoderHalf::DecoderHalf(int id, const ModelConfig& m, Part part)
    : PipelineLayer(id, LayerKind::kBlock),
      part_(part),
      norm_(register_module(NormName(part), nn::LayerNorm(nn::LayerNormOptions({m.hidden})))) {
  // Both parts are drawn, in the block's order, whichever is kept.
  auto attention = std::make_shared<DenseAttention>(m);
  auto mlp = std::make_shared<DenseMlp>(m);
  if (part == Part::kAttention) {
    branch_ = register_module("attention", std::shared_ptr<BlockPart>(std::move(attention)));
  } else {
    branch_ = register_module("mlp", std::shared_ptr<BlockPart>(std::move(mlp)));
  }
}

torch::Tensor DecoderHalf::Forward(const torch::Tensor& x, MicroBatchContext& ctx) {
  return x + branch_->Forward(norm_(x), ctx);
}

}  // namespace dynmo::trainer
