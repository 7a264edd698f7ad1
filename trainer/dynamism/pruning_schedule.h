// Gradual global magnitude pruning (--dynamism=pruning): its parameters and
// the Zhu & Gupta (2017) schedule the paper uses (§2.2, Appendix C.2):
//
//   S_t = S_f + (S_i - S_f) (1 - (t - t0) / (n Δt))^3,
//   t in {t0, t0 + Δt, ..., t0 + n Δt}
//
// with t0 = start, t0 + n Δt = end, Δt = every. The paper prunes from
// iteration 3000 to 7000 every 1000 iterations to 90% (the defaults); tests
// scale these down. A pruning step happens after the optimizer step of
// iteration t (Algorithm 1, lines 8-10), and the sparsity is the fraction of
// ALL prunable weights of the model removed (global, not per layer).
// Plain values and arithmetic, no LibTorch; thread-compatible.
#ifndef DYNMO_TRAINER_DYNAMISM_PRUNING_SCHEDULE_H_
#define DYNMO_TRAINER_DYNAMISM_PRUNING_SCHEDULE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace dynmo::trainer {

struct PruningConfig {
  int64_t start = 3000;          // t0: first pruning iteration
  int64_t end = 7000;            // t0 + n·Δt: last pruning iteration
  int64_t every = 1000;          // Δt
  double initial_sparsity = 0;   // S_i
  double final_sparsity = 0.9;   // S_f
  // A pruned weight matrix is stored (and multiplied) as CSR once its own
  // sparsity reaches this; below it stays dense with a mask, because the
  // CPU CSR kernels only beat a dense GEMM at high sparsity (trainer/README.md
  // "Pruning" has the measured break-even). 1 keeps every matrix dense.
  double csr_min_sparsity = 0.8;
  // --prune_form: "timed" (from csr_min_sparsity on, a matrix takes
  // whichever of masked and CSR runs faster on its device, timed when it is
  // pruned; prunable_linear.h) or "threshold" (CSR from csr_min_sparsity on,
  // no timing: the same forms on every run, as bit-for-bit comparisons of
  // runs need).
  std::string form = "timed";
};

// OK when 0 <= start <= end, every >= 1, (end - start) divisible by every,
// 0 <= S_i <= S_f < 1 and csr_min_sparsity in [0, 1]. Errors name the flag.
absl::Status ValidatePruningConfig(const PruningConfig& c);

// True when t is one of t0, t0 + Δt, ..., end.
bool IsPruningStep(const PruningConfig& c, int64_t t);

// The schedule's target sparsity at iteration t: 0 before start (dense),
// the closed form between start and end, S_f from end on. With start == end
// the single step prunes straight to S_f.
double TargetSparsity(const PruningConfig& c, int64_t t);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_DYNAMISM_PRUNING_SCHEDULE_H_
