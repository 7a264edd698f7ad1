#include "trainer/dynamism/early_exit_profile.h"

#include <iostream>

#include "trainer/model/decoder_block.h"

namespace dynmo::trainer {

EarlyExitProfile::EarlyExitProfile(const TrainerConfig& config)
    : num_layers_(config.model.num_pipeline_layers()),
      tokens_per_iteration_(static_cast<double>(config.dp) * config.microbatches *
                            config.micro_batch * config.model.seq_len),
      profile_(std::vector<double>(num_layers_, 1.0),
               config.model.dynamism.early_exit.event_delta) {}

absl::Status EarlyExitProfile::AfterStep(int64_t iter, StageView& stage) {
  // Tokens that left at layer l's exit point, this iteration.
  torch::Tensor t = torch::zeros({num_layers_}, torch::kDouble);
  auto v = t.accessor<double, 1>();
  for (OwnedLayer& owned : stage.layers) {
    auto* block = dynamic_cast<DecoderBlock*>(owned.layer.get());
    if (block == nullptr || block->exit_head() == nullptr) continue;
    v[owned.layer->id()] = static_cast<double>(block->exit_head()->TakeCounts().second);
  }
  // host-sync(steady): every iteration with early exit on: the tokens that left at each
  //   exit point, summed over the world for the exit profile (a CPU tensor, which NCCL
  //   stages through the device)
  if (absl::Status s = stage.transport.AllReduceSumWorld(t); !s.ok()) return s;
  // In flight after l = in flight after l-1 minus those leaving at l.
  std::vector<double> profile(num_layers_, 1.0);
  double in_flight = 1.0;
  for (int l = 0; l < num_layers_; ++l) {
    in_flight -= v[l] / tokens_per_iteration_;
    profile[l] = in_flight;
  }
  if (profile_.Update(profile) && stage.transport.rank() == 0) {
    std::cout << "dynmo-train: iteration " << iter
              << ": early exit: tokens in flight after blocks 1.." << num_layers_ - 2 << ": "
              << profile_.Format(1, num_layers_ - 1) << std::endl;
  }
  return absl::OkStatus();
}

bool EarlyExitProfile::TakeModelChanged() { return profile_.TakeChanged(); }

}  // namespace dynmo::trainer
