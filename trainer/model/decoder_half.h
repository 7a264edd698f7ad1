// DecoderHalf: one half of a pre-LayerNorm decoder block as its own pipeline
// layer, under --pipeline_units=halves (config.h's layer ids: block k's
// attention half is layer 2k-1, its MLP half layer 2k):
//
//   attention half:  h   = x + attention(ln_attention(x))
//   MLP half:        out = h + mlp(ln_mlp(h))
//
// the two lines of DecoderBlock::Body, with the same modules and names
// ("ln_attention.*", "attention.*" / "ln_mlp.*", "mlp.*"), so a stage may
// hold 1.5 blocks and the arithmetic is the block's: the stage runs each
// layer on a detached copy of its input, and the only new sum at the cut
// (h's gradient from the residual and from ln_mlp) has two terms, which
// floating point adds the same in either order.
//
// Initial weights: MakeLayer seeds both halves of block k with block k's
// stream, and both build the block's parts in its order (attention, then
// MLP), each keeping only its own; so the model cut in halves starts from
// the weights of the model cut in blocks.
// Modules are not thread-safe; one rank's thread owns its layers.
#ifndef DYNMO_TRAINER_MODEL_DECODER_HALF_H_
#define DYNMO_TRAINER_MODEL_DECODER_HALF_H_

#include <torch/torch.h>

#include <memory>

#include "trainer/config/config.h"
#include "trainer/model/decoder_block.h"
#include "trainer/model/gpt_layers.h"

namespace dynmo::trainer {

class DecoderHalf : public PipelineLayer {
 public:
  enum class Part { kAttention, kMlp };
  // Pipeline layer `id`: draws a block's dense attention and MLP from the
  // current generator (as MakeDecoderBlock does) and keeps `part`'s.
  DecoderHalf(int id, const ModelConfig& m, Part part);

  torch::Tensor Forward(const torch::Tensor& x, MicroBatchContext& ctx) override;
  Part part() const { return part_; }

 private:
  Part part_;
  torch::nn::LayerNorm norm_;
  std::shared_ptr<BlockPart> branch_;
};

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_MODEL_DECODER_HALF_H_
