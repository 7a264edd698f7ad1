#include "trainer/dynamism/mixture_of_depths.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace dynmo::trainer {
namespace {

namespace nn = torch::nn;
namespace F = torch::nn::functional;

// Runs the selected tokens `idx` [B, k] of x [B, T, H] through `body` and
// mixes them back: x + w · (body(x_sel) − x_sel) at the selected places.
torch::Tensor RunSelected(const torch::Tensor& x, const torch::Tensor& idx,
                          const torch::Tensor& weight, const DepthRouter::Body& body) {
  torch::Tensor idx_h =
      idx.unsqueeze(-1).expand({idx.size(0), idx.size(1), x.size(2)}).contiguous();
  torch::Tensor xs = x.gather(1, idx_h);
  torch::Tensor ys = body(xs);
  return x.scatter(1, idx_h, xs + weight.unsqueeze(-1) * (ys - xs));
}

}  // namespace

int64_t ModTokens(double capacity, int64_t seq_len) {
  const int64_t k = static_cast<int64_t>(std::llround(capacity * static_cast<double>(seq_len)));
  return std::clamp<int64_t>(k, 1, seq_len);
}

MixtureOfDepthsRouter::MixtureOfDepthsRouter(const ModelConfig& m)
    : capacity_(m.dynamism.mod_capacity),
      predictor_loss_weight_(m.dynamism.mod_predictor_loss_weight),
      router_(register_module("router",
                              nn::Linear(nn::LinearOptions(m.hidden, 1).bias(false)))),
      predictor_in_(register_module("predictor_in", nn::Linear(m.hidden, m.hidden))),
      predictor_out_(register_module("predictor_out", nn::Linear(m.hidden, 1))) {}

torch::Tensor MixtureOfDepthsRouter::PredictorLogits(const torch::Tensor& x) {
  return predictor_out_(F::gelu(predictor_in_(x))).squeeze(-1);
}

torch::Tensor MixtureOfDepthsRouter::Route(const torch::Tensor& x, MicroBatchContext& ctx,
                                           const Body& body) {
  const int64_t b = x.size(0), t = x.size(1);
  torch::Tensor scores = router_(x).squeeze(-1);  // [B, T]
  if (!is_training()) {
    // Causal inference: the predictor decides token by token.
    torch::Tensor chosen = PredictorLogits(x) > 0;
    std::vector<torch::Tensor> rows;
    for (int64_t i = 0; i < b; ++i) {
      torch::Tensor idx = torch::nonzero(chosen[i]).view({1, -1});
      torch::Tensor xi = x.narrow(0, i, 1);
      if (idx.size(1) == 0) {
        rows.push_back(xi);
        continue;
      }
      torch::Tensor w = torch::sigmoid(scores.narrow(0, i, 1).gather(1, idx));
      rows.push_back(RunSelected(xi, idx, w, body));
    }
    return torch::cat(rows, 0);
  }
  const int64_t k = ModTokens(capacity_, t);
  torch::Tensor idx = std::get<0>(std::get<1>(scores.topk(k, /*dim=*/1)).sort(1));
  last_selected_ = idx;
  torch::Tensor out = RunSelected(x, idx, torch::sigmoid(scores.gather(1, idx)), body);
  if (predictor_loss_weight_ > 0) {
    torch::Tensor target = torch::zeros({b, t}, x.options()).scatter(1, idx, 1.0f);
    torch::Tensor loss = F::binary_cross_entropy_with_logits(
        PredictorLogits(x.detach()), target);
    ctx.aux_losses.push_back(static_cast<float>(predictor_loss_weight_) * loss);
  }
  return out;
}

}  // namespace dynmo::trainer
