#include "core/scenario.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/scenario_models.h"
#include "core/scenario_random.h"

namespace dynmo::core {
namespace {

using scenario_internal::LayerLoad;
using scenario_internal::LoadSeries;

LoadSeries LoadsOf(const ScenarioConfig& c) {
  switch (c.scenario) {
    case Scenario::kPruning:
      return scenario_internal::PruningLoads(c);
    case Scenario::kFreezing:
      return scenario_internal::FreezingLoads(c);
    case Scenario::kSparseAttention:
      return scenario_internal::SparseAttentionLoads(c);
    case Scenario::kEarlyExit:
      return scenario_internal::EarlyExitLoads(c);
    case Scenario::kMoE:
      return scenario_internal::MoELoads(c);
    case Scenario::kMoD:
      return scenario_internal::MoDLoads(c);
    case Scenario::kDense:
      return scenario_internal::DenseSeries(c);
  }
  return {};
}

// Seconds of one layer: the dense block's passes scaled by what survives of
// each part of the block, times the profiler's jitter. Three jitter draws per
// layer whether or not a pass runs, so a pass switching off (freezing) does
// not reshuffle the noise of every later layer.
//
// `part` picks what of the block is priced: all of it, or one half of a
// split block (the attention half holds the attention core and the
// projections, the MLP half the MLP; weights and bytes 1/3 : 2/3).
enum class Part { kBlock, kAttention, kMlp };

TraceLayer Price(const ScenarioConfig& c, const LayerLoad& load, Part part,
                 ScenarioRandom& jitter) {
  const double a = c.attention_share;
  const bool attn = part != Part::kMlp;
  const bool mlp = part != Part::kAttention;
  const double matmuls =
      (attn ? load.projections / 3 : 0) + (mlp ? 2 * load.mlp / 3 : 0);
  const double fwd_or_bwd =
      load.tokens * ((attn ? a * load.attention : 0) + (1 - a) * matmuls);
  const double wgrad = load.tokens * matmuls;
  const double jf = std::exp(c.timing_noise * jitter.Normal());
  const double jb = std::exp(c.timing_noise * jitter.Normal());
  const double jw = std::exp(c.timing_noise * jitter.Normal());
  TraceLayer t;
  t.fwd_s = c.fwd_s * fwd_or_bwd * jf;
  t.bwd_s = load.needs_input_grad ? c.bwd_s * fwd_or_bwd * jb : 0;
  t.wgrad_s = load.needs_wgrad ? c.wgrad_s * wgrad * jw : 0;
  t.mem_bytes = part == Part::kBlock       ? load.mem_bytes
                : part == Part::kAttention ? load.mem_bytes / 3
                                           : load.mem_bytes - load.mem_bytes / 3;
  return t;
}

}  // namespace

absl::StatusOr<Trace> GenerateScenario(const ScenarioConfig& config) {
  if (absl::Status s = ValidateScenarioConfig(config); !s.ok()) return s;
  const LoadSeries loads = LoadsOf(config);
  ScenarioRandom jitter(config.seed, scenario_internal::kJitterStream);
  Trace trace(config.iterations);
  for (int k = 0; k < config.iterations; ++k) {
    trace[k].iter = k;
    trace[k].layers.reserve(config.split_blocks ? 2 * config.layers : config.layers);
    for (const LayerLoad& load : loads[k]) {
      if (config.split_blocks) {
        trace[k].layers.push_back(Price(config, load, Part::kAttention, jitter));
        trace[k].layers.push_back(Price(config, load, Part::kMlp, jitter));
      } else {
        trace[k].layers.push_back(Price(config, load, Part::kBlock, jitter));
      }
    }
  }
  return trace;
}

}  // namespace dynmo::core
