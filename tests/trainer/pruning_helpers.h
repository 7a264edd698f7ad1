// What the pruning suites share (prunable_linear_torch_test.cc,
// pruning_torch_test.cc): the single-process reference they check every
// pruning threshold against. Test-only.
#ifndef DYNMO_TESTS_TRAINER_PRUNING_HELPERS_H_
#define DYNMO_TESTS_TRAINER_PRUNING_HELPERS_H_

#include <torch/torch.h>

#include <cstdint>

namespace dynmo::trainer {

// The keep-th largest of `all` (1-based), the single-process reference.
inline float BruteForceThreshold(const torch::Tensor& all, int64_t keep) {
  return std::get<0>(torch::topk(all, keep)).min().item<float>();
}

}  // namespace dynmo::trainer

#endif  // DYNMO_TESTS_TRAINER_PRUNING_HELPERS_H_
