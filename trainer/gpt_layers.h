// The GPT decoder as a list of pipeline layers with stable global ids
// (config.h): 0 the token + position embedding, 1..N the pre-LayerNorm
// decoder blocks (causal multi-head self-attention + GELU MLP, each with a
// residual), N+1 the final LayerNorm + LM head + cross-entropy.
//
// Every layer has the same Forward signature so a stage runs any contiguous
// slice: the embedding reads int64 tokens [B, T], blocks map hidden states
// [B, T, H] to [B, T, H], the head returns the scalar mean cross-entropy
// against `targets`. Layer l's initial weights depend only on (seed, l), so
// any partition of the same job starts from the same model.
// Modules are not thread-safe; one rank's thread owns its layers.
#ifndef DYNMO_TRAINER_GPT_LAYERS_H_
#define DYNMO_TRAINER_GPT_LAYERS_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>

#include "trainer/config.h"

namespace dynmo::trainer {

enum class LayerKind { kEmbedding, kBlock, kHead };

class PipelineLayer : public torch::nn::Module {
 public:
  PipelineLayer(int id, LayerKind kind) : id_(id), kind_(kind) {}
  // `targets` is used by the head only.
  virtual torch::Tensor Forward(const torch::Tensor& x,
                                const torch::Tensor& targets) = 0;
  int id() const { return id_; }
  LayerKind kind() const { return kind_; }

 private:
  int id_;
  LayerKind kind_;
};

// Layer `id` of `model`, initialised from (seed, id) alone. This reseeds the
// global CPU generator (torch::manual_seed) as a side effect.
std::shared_ptr<PipelineLayer> MakeLayer(const ModelConfig& model, int id,
                                         uint64_t seed);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_GPT_LAYERS_H_
