// The per-case load models behind GenerateScenario (scenario.h). Internal to
// the scenario generator: callers use GenerateScenario.
//
// A model says, per iteration and per layer, how the layer's work differs
// from the dense block: which share of the tokens it sees, how much of its
// attention core and weight matmuls survive, which backward passes it still
// runs, and the bytes it holds. scenario.cc turns that into seconds and adds
// the profiler's jitter, so every model prices work the same way.
#ifndef DYNMO_CORE_SCENARIO_MODELS_H_
#define DYNMO_CORE_SCENARIO_MODELS_H_

#include <cstdint>
#include <vector>

#include "core/scenario_config.h"

namespace dynmo::core::scenario_internal {

// Multipliers on the dense block's work; 1 everywhere is the dense block.
struct LayerLoad {
  double tokens = 1;       // share of the micro-batch's tokens processed
  double attention = 1;    // attention core (F and B only: it has no weights)
  double projections = 1;  // QKV and output projections (F, B, W)
  double mlp = 1;          // MLP or MoE matmuls (F, B, W)
  bool needs_input_grad = true;
  bool needs_wgrad = true;
  int64_t mem_bytes = 0;  // resident bytes (absolute, not a multiplier)
};

// loads[k][i]: layer i at the k-th iteration of the trace.
using LoadSeries = std::vector<std::vector<LayerLoad>>;

// Streams of ScenarioRandom (scenario_random.h) the generator draws from.
inline constexpr uint64_t kTraitStream = 1;     // per-layer constants
inline constexpr uint64_t kDynamicsStream = 2;  // how the load evolves
inline constexpr uint64_t kJitterStream = 3;    // profiler noise

// Progress u in [0, 1] of iteration k of `iterations`.
double Progress(int k, int iterations);

// The six models; `config` has passed ValidateScenarioConfig.
LoadSeries PruningLoads(const ScenarioConfig& config);
LoadSeries FreezingLoads(const ScenarioConfig& config);
LoadSeries SparseAttentionLoads(const ScenarioConfig& config);
LoadSeries EarlyExitLoads(const ScenarioConfig& config);
LoadSeries MoELoads(const ScenarioConfig& config);
LoadSeries MoDLoads(const ScenarioConfig& config);
// Every block dense at every iteration.
LoadSeries DenseSeries(const ScenarioConfig& config);

}  // namespace dynmo::core::scenario_internal

#endif  // DYNMO_CORE_SCENARIO_MODELS_H_
