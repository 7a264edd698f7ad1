// The configuration of a synthetic dynamic-model scenario (scenario.h):
// which of the paper's six cases, how large, the dense block's base costs
// and the profiler's jitter. Plain data with its parser and validation; the
// generator and the per-case load models (scenario_models.h) both read it.
// Pure; thread-compatible.
#ifndef DYNMO_CORE_SCENARIO_CONFIG_H_
#define DYNMO_CORE_SCENARIO_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dynmo::core {

enum class Scenario {
  kPruning,
  kFreezing,
  kSparseAttention,
  kEarlyExit,
  kMoE,
  kMoD,
  // No dynamism: every block dense all along (jitter only). What a
  // straggler run (a slow rank, not a changing model) starts from.
  kDense
};

// "pruning", "freezing", "sparse-attention", "early-exit", "moe", "mod",
// "dense".
absl::StatusOr<Scenario> ParseScenario(absl::string_view name);
std::string ScenarioName(Scenario scenario);

struct ScenarioConfig {
  Scenario scenario = Scenario::kPruning;
  int layers = 48;
  int iterations = 200;
  uint64_t seed = 1;
  // One dense block per micro-batch at speed 1. B and W split the backward's
  // usual 2x-forward cost evenly, as the ZB paper assumes.
  double fwd_s = 0.010;
  double bwd_s = 0.010;
  double wgrad_s = 0.010;
  // Share of F and B spent in the attention core (QK^T, softmax, AV), which
  // has no weights; the rest is weight matmuls, 1/3 attention projections and
  // 2/3 MLP (8h^2 of a block's 12h^2 parameters).
  double attention_share = 0.3;
  int64_t layer_params = 12LL * 2048 * 2048;  // a GPT block, hidden 2048
  // fp16 weights and grads, fp32 master weights, Adam's two moments.
  int64_t bytes_per_param = 16;
  // Relative standard deviation of the profiler's per-pass jitter.
  double timing_noise = 0.01;
  // Finer pipeline units: each block becomes two trace layers, its attention
  // half (attention core + projections, 1/3 of the weights) then its MLP
  // half (2/3 of the weights), each with its own passes and bytes, so a
  // trace of `layers` blocks has 2 * layers layers.
  bool split_blocks = false;
};

// Returns OK when the sizes are positive, times and shares finite and in
// range; the message names the field.
absl::Status ValidateScenarioConfig(const ScenarioConfig& config);

}  // namespace dynmo::core

#endif  // DYNMO_CORE_SCENARIO_CONFIG_H_
