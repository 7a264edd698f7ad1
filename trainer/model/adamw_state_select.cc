#include "trainer/model/adamw_state_select.h"

namespace dynmo::trainer {

torch::optim::AdamWParamState* FindAdamWState(torch::optim::AdamW& optimizer,
                                              const torch::Tensor& param) {
  auto& state = optimizer.state();
  auto it = state.find(OptimizerStateKey(param));
  if (it == state.end()) return nullptr;
  return static_cast<torch::optim::AdamWParamState*>(it->second.get());
}

bool SelectAdamWState(torch::optim::AdamW& optimizer, const torch::Tensor& param,
                      const torch::Tensor& flat_index) {
  torch::optim::AdamWParamState* s = FindAdamWState(optimizer, param);
  if (s == nullptr) return false;
  torch::NoGradGuard no_grad;
  auto select = [&](const torch::Tensor& t) {
    return t.defined() ? t.reshape({-1}).index_select(0, flat_index).contiguous() : t;
  };
  s->exp_avg(select(s->exp_avg()));
  s->exp_avg_sq(select(s->exp_avg_sq()));
  s->max_exp_avg_sq(select(s->max_exp_avg_sq()));
  return true;
}

bool MaskAdamWState(torch::optim::AdamW& optimizer, const torch::Tensor& param,
                    const torch::Tensor& keep) {
  torch::optim::AdamWParamState* s = FindAdamWState(optimizer, param);
  if (s == nullptr) return false;
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& t : {s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()}) {
    if (t.defined()) t.masked_fill_(keep.logical_not(), 0);
  }
  return true;
}

}  // namespace dynmo::trainer
