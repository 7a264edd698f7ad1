#include "trainer/model/make_layer.h"

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>
#include <utility>

#include "trainer/model/decoder_block.h"
#include "trainer/model/decoder_half.h"
#include "trainer/model/early_exit.h"
#include "trainer/model/mixture_of_depths.h"
#include "trainer/model/moe.h"
#include "trainer/model/sparse_attention.h"

namespace dynmo::trainer {
namespace {

// The CPU generator only: torch::manual_seed would also reseed every CUDA
// generator, resetting the random stream of GPU training (dropout) each
// time a layer is built or migrates in. Layers are built on the CPU.
void SeedCpuGenerator(uint64_t seed) {
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(cpu.mutex());
  cpu.set_current_seed(seed);
}

}  // namespace

std::shared_ptr<PipelineLayer> MakeLayer(const ModelConfig& model, int id, uint64_t seed) {
  const int last = model.num_pipeline_layers() - 1;
  // Distinct, partition-independent stream per layer; under halves both
  // halves of block k draw block k's, and the head the head's of blocks.
  const int stream = !model.halves() || id == 0 ? id
                     : id == last               ? model.num_blocks + 1
                                                : (id + 1) / 2;
  SeedCpuGenerator(seed * 1000003ULL + static_cast<uint64_t>(stream));
  if (id == 0) return MakeEmbeddingLayer(model, id);
  if (id == last) return MakeHeadLayer(model, id);
  if (model.halves()) {
    return std::make_shared<DecoderHalf>(
        id, model, id % 2 == 1 ? DecoderHalf::Part::kAttention : DecoderHalf::Part::kMlp);
  }
  return MakeDecoderBlock(model, id);
}

std::shared_ptr<PipelineLayer> MakeDecoderBlock(const ModelConfig& model, int id) {
  // Attention, MLP, router: the order the generator is drawn in.
  const DynamismConfig& d = model.dynamism;
  std::shared_ptr<BlockPart> attention;
  if (d.IsSparseAttentionBlock(id)) {
    attention = std::make_shared<HashSparseAttention>(model);
  } else {
    attention = std::make_shared<DenseAttention>(model);
  }
  std::shared_ptr<BlockPart> mlp;
  if (d.IsMoeBlock(id)) {
    mlp = std::make_shared<MoeMlp>(model);
  } else {
    mlp = std::make_shared<DenseMlp>(model);
  }
  std::shared_ptr<DepthRouter> router;
  if (d.IsModBlock(id)) router = std::make_shared<MixtureOfDepthsRouter>(model);
  auto block = std::make_shared<DecoderBlock>(id, model, std::move(attention),
                                              std::move(mlp), std::move(router));
  // Last: an exit point draws after the block's own weights.
  if (d.Has("early-exit") && d.early_exit.HasExitPoint(id, model.num_blocks)) {
    block->SetExitHead(std::make_shared<EarlyExitHead>(model));
  }
  return block;
}

}  // namespace dynmo::trainer
