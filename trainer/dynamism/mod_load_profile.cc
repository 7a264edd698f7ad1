#include "trainer/dynamism/mod_load_profile.h"

#include <iostream>

#include "trainer/model/decoder_block.h"
#include "trainer/model/mixture_of_depths.h"

namespace dynmo::trainer {

ModLoadProfile::ModLoadProfile(const TrainerConfig& config)
    : num_layers_(config.model.num_pipeline_layers()),
      profile_(std::vector<double>(num_layers_, 1.0), config.model.dynamism.mod_event_delta) {}

absl::Status ModLoadProfile::AfterStep(int64_t iter, StageView& stage) {
  // Row 0: tokens that reached layer l's router; row 1: tokens it ran.
  torch::Tensor t = torch::zeros({2, num_layers_}, torch::kDouble);
  auto v = t.accessor<double, 2>();
  for (OwnedLayer& owned : stage.layers) {
    auto* block = dynamic_cast<DecoderBlock*>(owned.layer.get());
    auto* router = block == nullptr
                       ? nullptr
                       : dynamic_cast<MixtureOfDepthsRouter*>(block->depth_router());
    if (router == nullptr) continue;
    const auto [seen, routed] = router->TakeCounts();
    v[0][owned.layer->id()] = static_cast<double>(seen);
    v[1][owned.layer->id()] = static_cast<double>(routed);
  }
  // host-sync(steady): every iteration with MoD on: the tokens each router saw and ran,
  //   summed over the world for the load profile (a CPU tensor, which NCCL stages through
  //   the device)
  if (absl::Status s = stage.transport.AllReduceSumWorld(t); !s.ok()) return s;
  std::vector<double> profile(num_layers_, 1.0);
  for (int l = 0; l < num_layers_; ++l) {
    if (v[0][l] > 0) profile[l] = v[1][l] / v[0][l];
  }
  if (profile_.Update(profile) && stage.transport.rank() == 0) {
    std::cout << "dynmo-train: iteration " << iter << ": mod: tokens run by blocks 1.."
              << num_layers_ - 2 << ": " << profile_.Format(1, num_layers_ - 1) << std::endl;
  }
  return absl::OkStatus();
}

bool ModLoadProfile::TakeModelChanged() { return profile_.TakeChanged(); }

}  // namespace dynmo::trainer
