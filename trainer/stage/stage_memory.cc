#include "trainer/stage/stage_memory.h"

#include <unistd.h>

#include <memory>

#include "trainer/comm/dist_env.h"
#include "trainer/model/prunable_linear.h"

namespace dynmo::trainer {
namespace {

int64_t Bytes(const torch::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.numel() * t.element_size()) : 0;
}

}  // namespace

int64_t LayerResidentBytes(const OwnedLayer& owned) {
  int64_t n = 0;
  for (const torch::Tensor& p : owned.layer->parameters()) {
    n += Bytes(p);
    // Its gradient has its shape and dtype, and the next backward allocates
    // it again when zero_grad (set_to_none) freed it.
    if (p.grad().defined()) {
      n += Bytes(p.grad());
    } else if (p.requires_grad()) {
      n += Bytes(p);
    }
  }
  for (const torch::Tensor& b : owned.layer->buffers()) n += Bytes(b);
  for (const auto& [key, state] : owned.optimizer->state()) {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*state);
    n += Bytes(s.exp_avg()) + Bytes(s.exp_avg_sq()) + Bytes(s.max_exp_avg_sq());
  }
  return n;
}

int64_t LayerNonZeroParameters(const OwnedLayer& owned) {
  int64_t n = 0;
  for (const torch::Tensor& p : owned.layer->parameters()) n += p.numel();
  // A masked weight keeps its dense shape: what the mask pruned is gone.
  for (const std::shared_ptr<torch::nn::Module>& m : owned.layer->modules()) {
    if (const auto* linear = m->as<PrunableLinearImpl>()) {
      n -= linear->weight.numel() - linear->nnz();
    }
  }
  return n;
}

int64_t DefaultMemoryCapacityBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const int64_t physical = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
  return physical / LocalRanks(ProcessEnv());
}

}  // namespace dynmo::trainer
