#include "trainer/model/mixture_of_depths.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace dynmo::trainer {
namespace {

namespace nn = torch::nn;
namespace F = torch::nn::functional;

// Runs the chosen tokens of x [B, T, H] through `body`, packed [B, width, H]
// (each sequence's tokens first, in causal order; padding slots repeat its
// last position and their outputs are dropped), and mixes the real ones
// back: x + σ(score) · (body(x) − x) at the chosen places.
torch::Tensor RunChosen(const torch::Tensor& x, const TokenSubset& chosen,
                        const torch::Tensor& scores, const DepthRouter::Body& body) {
  const int64_t b = x.size(0), t = x.size(1), h = x.size(2);
  const torch::Tensor rows = x.reshape({b * t, h});
  if (chosen.count() == 0) return x.clone();
  const torch::Tensor slot_rows =
      (torch::arange(b, chosen.slot_pos.options()).unsqueeze(1) * t + chosen.slot_pos)
          .reshape({-1});
  const torch::Tensor ys = body(rows.index_select(0, slot_rows).view({b, chosen.width, h}))
                               .reshape({-1, h})
                               .index_select(0, chosen.slot);
  const torch::Tensor xs = rows.index_select(0, chosen.flat);
  const torch::Tensor w = torch::sigmoid(scores.reshape({-1}).index_select(0, chosen.flat));
  return rows.index_copy(0, chosen.flat, xs + w.unsqueeze(-1) * (ys - xs)).view_as(x);
}

}  // namespace

int64_t ModTokens(double capacity, int64_t seq_len) {
  const int64_t k = static_cast<int64_t>(std::llround(capacity * static_cast<double>(seq_len)));
  return std::clamp<int64_t>(k, 1, seq_len);
}

MixtureOfDepthsRouter::MixtureOfDepthsRouter(const ModelConfig& m)
    : capacity_(m.dynamism.mod_capacity),
      predictor_loss_weight_(m.dynamism.mod_predictor_loss_weight),
      by_predictor_(m.dynamism.mod_routing == "predictor"),
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
  const torch::Tensor scores = router_(x).squeeze(-1);  // [B, T]
  // The predictor sees the block input detached: only its BCE trains it.
  const torch::Tensor logits = PredictorLogits(x.detach());
  torch::Tensor top_k;  // [B, k]: the router's choice, the predictor's target
  if (is_training()) {
    const int64_t k = ModTokens(capacity_, t);
    top_k = std::get<0>(std::get<1>(scores.topk(k, /*dim=*/1)).sort(1));
    last_selected_ = top_k;
  }
  torch::Tensor chosen;  // [B, T] bool: the tokens that run the block
  if (by_predictor_ || !is_training()) {
    chosen = logits.detach() > 0;  // causal: decided token by token
  } else {
    chosen = torch::zeros({b, t}, x.options().dtype(torch::kBool)).scatter(1, top_k, true);
  }
  const TokenSubset subset = SelectTokens(chosen);
  last_routed_ = subset.count();
  routed_ += subset.count();
  seen_ += b * t;
  torch::Tensor out = RunChosen(x, subset, scores, body);
  if (is_training() && predictor_loss_weight_ > 0) {
    const torch::Tensor target = torch::zeros({b, t}, x.options()).scatter(1, top_k, 1.0f);
    F::BinaryCrossEntropyWithLogitsFuncOptions options;
    if (by_predictor_ && capacity_ < 1) {
      // The positives weigh (1 − c)/c: logit > 0 then means P(top-k) > c, so
      // an undecided predictor routes about half the tokens and the count
      // falls toward k as it learns. Unweighted, it would first learn the
      // prior (P = c < ½ everywhere) and route no token at all.
      options.pos_weight(torch::full({1}, (1 - capacity_) / capacity_, x.options()));
    }
    const torch::Tensor loss = F::binary_cross_entropy_with_logits(logits, target, options);
    ctx.aux_losses.push_back(static_cast<float>(predictor_loss_weight_) * loss);
  }
  return out;
}

std::pair<int64_t, int64_t> MixtureOfDepthsRouter::TakeCounts() {
  std::pair<int64_t, int64_t> counts{seen_, routed_};
  seen_ = routed_ = 0;
  return counts;
}

}  // namespace dynmo::trainer
