#include "trainer/dynamism/mod_load_profile.h"

#include <iostream>

#include "trainer/model/decoder_block.h"
#include "trainer/model/mixture_of_depths.h"

namespace dynmo::trainer {

ModLoadProfile::ModLoadProfile(const TrainerConfig& config)
    : num_layers_(config.model.num_pipeline_layers()),
      profile_(std::vector<double>(num_layers_, 1.0), config.model.dynamism.mod_event_delta) {}

void ModLoadProfile::FillReport(StageView& stage, absl::Span<double> slots) {
  // Slot l: tokens that reached layer l's router; slot L + l: tokens it ran.
  for (OwnedLayer& owned : stage.layers) {
    auto* block = dynamic_cast<DecoderBlock*>(owned.layer.get());
    auto* router = block == nullptr
                       ? nullptr
                       : dynamic_cast<MixtureOfDepthsRouter*>(block->depth_router());
    if (router == nullptr) continue;
    const auto [seen, routed] = router->TakeCounts();
    slots[owned.layer->id()] = static_cast<double>(seen);
    slots[num_layers_ + owned.layer->id()] = static_cast<double>(routed);
  }
}

void ModLoadProfile::ReportSummed(int64_t iter, absl::Span<const double> slots, int rank) {
  std::vector<double> profile(num_layers_, 1.0);
  for (int l = 0; l < num_layers_; ++l) {
    if (slots[l] > 0) profile[l] = slots[num_layers_ + l] / slots[l];
  }
  if (profile_.Update(profile) && rank == 0) {
    std::cout << "dynmo-train: iteration " << iter << ": mod: tokens run by blocks 1.."
              << num_layers_ - 2 << ": " << profile_.Format(1, num_layers_ - 1) << std::endl;
  }
}

bool ModLoadProfile::TakeModelChanged() { return profile_.TakeChanged(); }

}  // namespace dynmo::trainer
