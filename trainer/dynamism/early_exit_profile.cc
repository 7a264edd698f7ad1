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

void EarlyExitProfile::FillReport(StageView& stage, absl::Span<double> slots) {
  // Tokens that left at layer l's exit point, this iteration.
  for (OwnedLayer& owned : stage.layers) {
    auto* block = dynamic_cast<DecoderBlock*>(owned.layer.get());
    if (block == nullptr || block->exit_head() == nullptr) continue;
    slots[owned.layer->id()] = static_cast<double>(block->exit_head()->TakeCounts().second);
  }
}

void EarlyExitProfile::ReportSummed(int64_t iter, absl::Span<const double> slots, int rank) {
  // In flight after l = in flight after l-1 minus those leaving at l.
  std::vector<double> profile(num_layers_, 1.0);
  double in_flight = 1.0;
  for (int l = 0; l < num_layers_; ++l) {
    in_flight -= slots[l] / tokens_per_iteration_;
    profile[l] = in_flight;
  }
  if (profile_.Update(profile) && rank == 0) {
    std::cout << "dynmo-train: iteration " << iter
              << ": early exit: tokens in flight after blocks 1.." << num_layers_ - 2 << ": "
              << profile_.Format(1, num_layers_ - 1) << std::endl;
  }
}

bool EarlyExitProfile::TakeModelChanged() { return profile_.TakeChanged(); }

}  // namespace dynmo::trainer
