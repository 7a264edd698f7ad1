// PruningConfig: the parameters of gradual global magnitude pruning
// (--dynamism=pruning, --prune_*), as a plain struct held by DynamismConfig,
// with their validation (no LibTorch). The schedule they drive (which
// iterations prune, to what sparsity) is trainer/dynamism/pruning_schedule.h;
// the pruning itself is trainer/dynamism/pruning.h. Thread-compatible value
// type.
#ifndef DYNMO_TRAINER_CONFIG_PRUNING_CONFIG_H_
#define DYNMO_TRAINER_CONFIG_PRUNING_CONFIG_H_

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

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_CONFIG_PRUNING_CONFIG_H_
