// The GPT decoder as a list of pipeline layers with stable global ids
// (config.h): 0 the token + position embedding, 1..N the pre-LayerNorm
// decoder blocks (causal multi-head self-attention + GELU MLP, each with a
// residual; trainer/model/decoder_block.h), N+1 the final LayerNorm + LM head +
// cross-entropy.
//
// Every layer has the same Forward signature so a stage runs any contiguous
// slice: the embedding reads int64 tokens [B, T], blocks map hidden states
// [B, T, H] to [B, T, H], the head returns the scalar mean cross-entropy
// against the micro-batch's targets. Layer l's initial weights depend only on (seed, l), so
// any partition of the same job starts from the same model.
// Modules are not thread-safe; one rank's thread owns its layers.
#ifndef DYNMO_TRAINER_MODEL_GPT_LAYERS_H_
#define DYNMO_TRAINER_MODEL_GPT_LAYERS_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainer/config/config.h"

namespace dynmo::trainer {

enum class LayerKind { kEmbedding, kBlock, kHead };

// What one micro-batch carries through a stage's layers besides the hidden
// states. A PipelineStage keeps one per micro-batch in flight.
struct MicroBatchContext {
  int64_t iteration = 0;
  int micro_batch = 0;
  // [B, T] int64 next-token ids: the head's targets (and any layer's
  // auxiliary prediction loss). Defined on stages that need them.
  torch::Tensor targets;
  // [B, T] bool, early exit: tokens still in flight. Undefined = all of them.
  // Travels between stages with the activations when a scheme sets it.
  torch::Tensor token_active;
  // Scalars a layer adds to the training objective (already weighted:
  // MoE balance loss, MoD router loss, early-exit losses). Backward adds
  // the ones a layer appended during its Forward to that layer's backward.
  std::vector<torch::Tensor> aux_losses;
};

class PipelineLayer : public torch::nn::Module {
 public:
  PipelineLayer(int id, LayerKind kind) : id_(id), kind_(kind) {}
  // Embedding: int64 tokens -> [B, T, H]; block: [B, T, H] -> [B, T, H];
  // head: the scalar mean cross-entropy against `ctx.targets`.
  virtual torch::Tensor Forward(const torch::Tensor& x, MicroBatchContext& ctx) = 0;
  int id() const { return id_; }
  LayerKind kind() const { return kind_; }

 private:
  int id_;
  LayerKind kind_;
};

// The first and the last pipeline layer of `model` (ids 0 and
// num_pipeline_layers() - 1), drawing their weights from the global CPU
// generator. Every layer is built through MakeLayer (make_layer.h).
std::shared_ptr<PipelineLayer> MakeEmbeddingLayer(const ModelConfig& model, int id);
std::shared_ptr<PipelineLayer> MakeHeadLayer(const ModelConfig& model, int id);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_MODEL_GPT_LAYERS_H_
