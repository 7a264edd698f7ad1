// Synthetic traces of the paper's six dynamic models (§2.2), for replaying
// static against dynamic balancing without a GPU.
//
// Every layer starts as the same dense transformer block (ScenarioConfig's
// base F/B/W times and parameter count); each scenario then applies its load
// model per layer and per iteration, and the profiler's jitter is added last.
// Progress u = k / (iterations - 1) runs from 0 to 1 over the trace.
//
//   pruning           gradual global magnitude pruning to 90% sparsity on the
//                     Zhu-Gupta cubic schedule, applied in 10 steps between
//                     u = 0.1 and u = 0.8. Layers keep different fractions
//                     (one global threshold over layers whose weights have
//                     different scales; edge layers keep more). A pruned
//                     layer runs a sparse kernel only once its density is
//                     below the kernel's break-even (30%): above it, dense
//                     is faster and nothing is saved. Sparse layers are
//                     stored in CSR and shrink; dense-run layers do not.
//   freezing          layers converge front to back and are frozen at
//                     freeze checks every iterations/20 from u = 0.2; up to
//                     75% of the layers freeze, in roughly depth order with
//                     per-layer jitter. A layer in the frozen prefix skips
//                     its whole backward (no W, no B), and so does B of the
//                     first trainable layer after it (nothing earlier wants
//                     that gradient); a frozen layer after a trainable one
//                     skips W but still passes B on. Frozen layers drop
//                     grads and optimizer state (2 bytes/param).
//   sparse-attention  hash-based sparse flash attention: each layer computes
//                     a fraction s of its attention blocks. s starts near 0.5
//                     everywhere and drifts to ~0.6 at the first layer down
//                     to ~0.15 at the last (deeper layers sparser, with
//                     per-layer jitter), plus per-iteration batch noise
//                     (AR(1) in log space). Only the attention core of F and
//                     B scales; W has no attention work and does not.
//   early-exit        CALM-style token exits: the fraction of tokens reaching
//                     depth x is exp(-kappa * x^2); kappa grows with training
//                     (15% of tokens reach the last layer at u = 1) and
//                     jitters per batch. All passes scale with tokens.
//   moe               every other layer is a top-2 MoE with 8 experts; the
//                     layer waits for its busiest expert, so its MLP time
//                     scales with 8 * max share. Router logits drift (AR(1),
//                     mean-reverting like an auxiliary loss), and their
//                     spread grows with training and with depth: by the end
//                     the MoE layers' times differ by ~40% across layers.
//                     MoE layers hold two experts' worth of MLP weights.
//   mod               Mixture-of-Depths: every other block is routed. Its
//                     capacity anneals from all tokens to 12.5% by u = 0.3.
//                     Each routed block's predictor is miscalibrated its own
//                     way (a per-layer bias) and errs per batch (AR(1)), so
//                     the tokens it really processes stray from capacity; the
//                     MoE inside every block adds a mild expert imbalance.
//                     Stages holding an odd number of blocks get unequal
//                     mixes of routed and full blocks, which is where
//                     uniform partitioning suffers.
//
// The base per-layer cost, size and jitter are the same for all six, so
// traces of different cases compare directly. The constants behind each
// model are named in scenario_models.cc.
//
// Deterministic: the same config gives the same trace on every platform (see
// scenario_random.h), up to the last-bit rounding of the C library's
// exp/log/erfc. Pure; thread-compatible.
#ifndef DYNMO_CORE_SCENARIO_H_
#define DYNMO_CORE_SCENARIO_H_

#include "absl/status/statusor.h"
#include "core/scenario_config.h"
#include "core/trace.h"

namespace dynmo::core {

// The trace of `config.scenario`: `iterations` records with iter 0, 1, ...,
// each of `layers` layers.
absl::StatusOr<Trace> GenerateScenario(const ScenarioConfig& config);

}  // namespace dynmo::core

#endif  // DYNMO_CORE_SCENARIO_H_
