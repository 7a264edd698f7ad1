// MakeLayer: pipeline layer `id` of a model — the embedding, a decoder block
// with the parts its dynamic-model scheme asks for (sparse attention, MoE,
// Mixture of Depths, an early-exit head), half of a dense block
// (--pipeline_units=halves, decoder_half.h), or the LM head — initialised
// from (seed, id) alone, so a layer is the same whichever stage builds it
// (halves draw their block's stream, so both cuts start alike). The one
// place that knows every kind of layer, so that the layers themselves do not
// depend on each other. Reseeds the global CPU generator as a side effect
// (only it: the CUDA generators GPU training draws from are left alone);
// not thread-safe.
#ifndef DYNMO_TRAINER_MODEL_MAKE_LAYER_H_
#define DYNMO_TRAINER_MODEL_MAKE_LAYER_H_

#include <cstdint>
#include <memory>

#include "trainer/config/config.h"
#include "trainer/model/gpt_layers.h"

namespace dynmo::trainer {

std::shared_ptr<PipelineLayer> MakeLayer(const ModelConfig& model, int id, uint64_t seed);

// Decoder block `id` of `model` with the parts model.dynamism asks for.
// Draws its initial weights from the global CPU generator (MakeLayer seeds
// it from (seed, id) first).
std::shared_ptr<PipelineLayer> MakeDecoderBlock(const ModelConfig& model, int id);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_MODEL_MAKE_LAYER_H_
