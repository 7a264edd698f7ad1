// The registry of stage-level schemes. Each scheme with iteration-boundary
// work adds itself here.
#include "trainer/dynamism/dynamism.h"
#include "trainer/dynamism/early_exit_profile.h"
#include "trainer/dynamism/freezing.h"
#include "trainer/dynamism/mod_load_profile.h"
#include "trainer/dynamism/pruning.h"

namespace dynmo::trainer {

std::vector<std::unique_ptr<Dynamism>> MakeStageDynamisms(const TrainerConfig& config) {
  std::vector<std::unique_ptr<Dynamism>> schemes;
  (void)config;
  if (config.model.dynamism.Has("pruning")) {
    schemes.push_back(std::make_unique<GradualPruning>(config.model.dynamism.pruning));
  }
  if (config.model.dynamism.Has("freezing")) {
    schemes.push_back(std::make_unique<Freezing>(config));
  }
  if (config.model.dynamism.Has("early-exit")) {
    schemes.push_back(std::make_unique<EarlyExitProfile>(config));
  }
  if (config.model.dynamism.Has("mod") && config.model.dynamism.mod_routing == "predictor") {
    schemes.push_back(std::make_unique<ModLoadProfile>(config));
  }
  return schemes;
}

}  // namespace dynmo::trainer
