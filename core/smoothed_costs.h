// The layer costs a decision is taken on: measured records averaged over a
// window that follows how the model changes — long enough to average the
// profiler's jitter away, cut at the newest step change (a pruning step, a
// freeze) so a step is followed at once. Used by the trace replays
// (replay.h, elastic_replay.h). Pure; thread-compatible.
#ifndef DYNMO_CORE_SMOOTHED_COSTS_H_
#define DYNMO_CORE_SMOOTHED_COSTS_H_

#include <deque>
#include <vector>

#include "core/cost_model.h"

namespace dynmo::core {

// The costs a decision uses: the mean of the newest record and the ones
// before it, newest first, up to the first whose times differ from the mean
// so far by more than `step_threshold`. Precondition: `recent` non-empty,
// oldest first, equal layer counts.
std::vector<LayerCost> SmoothedCosts(const std::deque<std::vector<LayerCost>>& recent,
                                     double step_threshold);

// The mean of `records` layer by layer (F, B, W and bytes); ids 0..n-1.
// Precondition: non-empty, equal layer counts.
std::vector<LayerCost> MeanCosts(const std::vector<std::vector<LayerCost>>& records);

}  // namespace dynmo::core

#endif  // DYNMO_CORE_SMOOTHED_COSTS_H_
