// Gradual global magnitude pruning (--dynamism=pruning): the Zhu & Gupta
// (2017) schedule the paper uses (§2.2, Appendix C.2):
//
//   S_t = S_f + (S_i - S_f) (1 - (t - t0) / (n Δt))^3,
//   t in {t0, t0 + Δt, ..., t0 + n Δt}
//
// with t0 = start, t0 + n Δt = end, Δt = every. The paper prunes from
// iteration 3000 to 7000 every 1000 iterations to 90% (the defaults); tests
// scale these down. A pruning step happens after the optimizer step of
// iteration t (Algorithm 1, lines 8-10), and the sparsity is the fraction of
// ALL prunable weights of the model removed (global, not per layer).
// Its parameters are PruningConfig (trainer/config/pruning_config.h).
// Plain arithmetic, no LibTorch; thread-compatible.
#ifndef DYNMO_TRAINER_DYNAMISM_PRUNING_SCHEDULE_H_
#define DYNMO_TRAINER_DYNAMISM_PRUNING_SCHEDULE_H_

#include <cstdint>

#include "trainer/config/pruning_config.h"

namespace dynmo::trainer {

// True when t is one of t0, t0 + Δt, ..., end.
bool IsPruningStep(const PruningConfig& c, int64_t t);

// The schedule's target sparsity at iteration t: 0 before start (dense),
// the closed form between start and end, S_f from end on. With start == end
// the single step prunes straight to S_f.
double TargetSparsity(const PruningConfig& c, int64_t t);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_DYNAMISM_PRUNING_SCHEDULE_H_
