// dynmo-train's model flags: the model, its data, the optimiser, pp x dp.
#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "trainer/run/train_flags.h"

ABSL_FLAG(int, layers, 4, "decoder blocks (pipeline layers = blocks + embedding + head)");
ABSL_FLAG(std::string, pipeline_units, "blocks",
          "what a pipeline layer between embedding and head is: blocks (a decoder block) "
          "or halves (a block's attention half and MLP half are two layers, so a stage "
          "may hold 1.5 blocks; --dynamism=none only)");
ABSL_FLAG(int, hidden, 64, "hidden size");
ABSL_FLAG(int, heads, 4, "attention heads (must divide --hidden)");
ABSL_FLAG(int, seq_len, 32, "tokens per sample");
ABSL_FLAG(int, vocab, 256, "vocabulary size (256 covers byte-level text)");
ABSL_FLAG(int, micro_batch, 4, "samples per micro-batch");
ABSL_FLAG(int, microbatches, 4, "micro-batches per iteration per dp replica");
ABSL_FLAG(int, steps, 20, "training iterations");
ABSL_FLAG(double, lr, 1e-3, "AdamW learning rate");
ABSL_FLAG(double, weight_decay, 0.01, "AdamW weight decay");
ABSL_FLAG(uint64_t, seed, 1234, "initialisation seed");
ABSL_FLAG(int, pp, 1, "pipeline stages");
ABSL_FLAG(int, dp, 1, "data-parallel replicas (pp * dp must equal WORLD_SIZE)");
ABSL_FLAG(std::string, data, DYNMO_TRAINER_DEFAULT_DATA,
          "plain text file (byte tokens) or Megatron .bin/.idx prefix");

namespace dynmo::trainer {

absl::Status ReadModelFlags(TrainerConfig& c) {
  c.model.num_blocks = absl::GetFlag(FLAGS_layers);
  c.model.pipeline_units = absl::GetFlag(FLAGS_pipeline_units);
  c.model.hidden = absl::GetFlag(FLAGS_hidden);
  c.model.heads = absl::GetFlag(FLAGS_heads);
  c.model.seq_len = absl::GetFlag(FLAGS_seq_len);
  c.model.vocab = absl::GetFlag(FLAGS_vocab);
  c.micro_batch = absl::GetFlag(FLAGS_micro_batch);
  c.microbatches = absl::GetFlag(FLAGS_microbatches);
  c.steps = absl::GetFlag(FLAGS_steps);
  c.lr = absl::GetFlag(FLAGS_lr);
  c.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  c.seed = absl::GetFlag(FLAGS_seed);
  c.pp = absl::GetFlag(FLAGS_pp);
  c.dp = absl::GetFlag(FLAGS_dp);
  c.data = absl::GetFlag(FLAGS_data);
  return absl::OkStatus();
}

}  // namespace dynmo::trainer
