#include "trainer/model/moe.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace dynmo::trainer {

int64_t MoeCapacity(double capacity_factor, int64_t tokens, int64_t experts) {
  const double c = std::ceil(capacity_factor * static_cast<double>(tokens) * 2.0 /
                             static_cast<double>(experts));
  return std::max<int64_t>(1, static_cast<int64_t>(c));
}

MoeRouting RouteTopTwo(const torch::Tensor& probs, int64_t capacity) {
  const int64_t n = probs.size(0), e = probs.size(1);
  MoeRouting r;
  std::tuple<torch::Tensor, torch::Tensor> top = probs.topk(2, /*dim=*/1);
  torch::Tensor top_probs = std::get<0>(top);
  r.experts = std::get<1>(top);
  r.gates = top_probs / top_probs.sum(1, /*keepdim=*/true);

  // Slots in choice-major order (all first choices, then all second ones):
  // a slot's position in its expert's queue decides whether it fits.
  torch::Tensor slot_expert = r.experts.t().reshape({2 * n});  // [2N]
  torch::Tensor one_hot =
      torch::zeros({2 * n, e}, slot_expert.options().dtype(torch::kLong)).scatter_(1, slot_expert.unsqueeze(1), 1);
  torch::Tensor position =
      (one_hot.cumsum(0) - 1).gather(1, slot_expert.unsqueeze(1)).squeeze(1);  // [2N]
  torch::Tensor slot_kept = position < capacity;
  r.kept = slot_kept.view({2, n}).t().contiguous();
  r.dropped = (~slot_kept).sum();

  torch::Tensor slot_token = torch::arange(n, slot_expert.options().dtype(torch::kLong)).repeat({2});
  torch::Tensor slot_gate = r.gates.t().reshape({2 * n});
  r.assigned = one_hot.sum(0);  // [E]
  // The kept slots grouped by expert in one stable sort (a dropped slot's
  // key, e, sorts last), so within an expert they stay in slot order: what
  // a per-expert scan would select, with one wait instead of one per expert.
  torch::Tensor key = torch::where(slot_kept, slot_expert, torch::full_like(slot_expert, e));
  torch::Tensor order = std::get<1>(key.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false));
  // host-sync(model): per MoE layer and micro-batch: each expert's kept-token count sizes its
  //   batch (dynamic shapes, as in dropless MoE): one read of the E counts (it was one wait
  //   per expert)
  const torch::Tensor counts =
      torch::bincount(key, /*weights=*/{}, /*minlength=*/e + 1).to(torch::kCPU);
  const auto count = counts.accessor<int64_t, 1>();
  int64_t at = 0;
  for (int64_t x = 0; x < e; ++x) {
    torch::Tensor slots = order.narrow(0, at, count[x]);
    at += count[x];
    r.tokens.push_back(slot_token.index_select(0, slots));
    r.token_gates.push_back(slot_gate.index_select(0, slots));
  }
  return r;
}

torch::Tensor MoeBalanceLoss(const torch::Tensor& probs, const MoeRouting& routing) {
  const int64_t n = probs.size(0), e = probs.size(1);
  torch::Tensor f = routing.assigned.to(torch::kFloat) / static_cast<float>(2 * n);
  torch::Tensor p = probs.mean(0);
  return static_cast<float>(e) * (f * p).sum();
}

MoeMlp::MoeMlp(const ModelConfig& m)
    : capacity_factor_(m.dynamism.moe_capacity_factor),
      aux_loss_weight_(m.dynamism.moe_aux_loss_weight),
      router_(register_module(
          "router", torch::nn::Linear(torch::nn::LinearOptions(m.hidden,
                                                               m.dynamism.moe_experts)
                                          .bias(false)))) {
  for (int e = 0; e < m.dynamism.moe_experts; ++e) {
    experts_.push_back(
        register_module("expert" + std::to_string(e), std::make_shared<DenseMlp>(m)));
  }
}

torch::Tensor MoeMlp::Forward(const torch::Tensor& x, MicroBatchContext& ctx) {
  const int64_t h = x.size(-1);
  torch::Tensor flat = x.reshape({-1, h});  // [N, H]
  const int64_t n = flat.size(0);
  torch::Tensor probs = torch::softmax(router_(flat), /*dim=*/1);
  const int64_t e = num_experts();
  last_routing_ = RouteTopTwo(probs, MoeCapacity(capacity_factor_, n, e));
  torch::Tensor out = torch::zeros_like(flat);
  for (int64_t i = 0; i < e; ++i) {
    const torch::Tensor& tokens = last_routing_.tokens[i];
    if (tokens.numel() == 0) continue;
    torch::Tensor y = experts_[i]->Forward(flat.index_select(0, tokens), ctx);
    out = out.index_add(0, tokens, y * last_routing_.token_gates[i].unsqueeze(1));
  }
  if (aux_loss_weight_ > 0 && is_training()) {
    ctx.aux_losses.push_back(static_cast<float>(aux_loss_weight_) *
                             MoeBalanceLoss(probs, last_routing_));
  }
  return out.view(x.sizes());
}

}  // namespace dynmo::trainer
