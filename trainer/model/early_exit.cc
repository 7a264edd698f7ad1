#include "trainer/model/early_exit.h"

#include <cmath>
#include <limits>

namespace dynmo::trainer {
namespace {
namespace nn = torch::nn;
namespace F = torch::nn::functional;
}  // namespace

torch::Tensor ActiveCausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, const ActiveTokens& active) {
  const int64_t heads = q.size(1), d = q.size(2);
  const int64_t b = k.size(0), t = k.size(2), m = active.width;
  // Scaled on the n queries rather than on the scores (heads·T per query).
  const torch::Tensor scaled = q * (1.0 / std::sqrt(double(d)));
  // Queries into their sequences' slots, [B, heads, width, d]; padding
  // slots hold zero queries whose outputs are dropped.
  const torch::Tensor packed = torch::zeros({b * m, heads, d}, q.options())
                                   .index_copy(0, active.slot, scaled)
                                   .view({b, m, heads, d})
                                   .transpose(1, 2);
  torch::Tensor scores = packed.matmul(k.transpose(-2, -1));  // [B, heads, width, T]
  // Later positions of each slot's own sequence are masked: [B, 1, width, T].
  const torch::Tensor future = torch::arange(t, active.slot_pos.options()).view({1, 1, t}) >
                               active.slot_pos.unsqueeze(-1);
  scores = scores.masked_fill(future.unsqueeze(1), -std::numeric_limits<float>::infinity());
  const torch::Tensor y = torch::softmax(scores, -1).matmul(v);  // [B, heads, width, d]
  return y.transpose(1, 2).reshape({b * m, heads * d}).index_select(0, active.slot);
}

EarlyExitHead::EarlyExitHead(const ModelConfig& m)
    : threshold_(m.dynamism.early_exit.threshold),
      loss_weight_(m.dynamism.early_exit.loss_weight),
      warmup_iters_(m.dynamism.early_exit.warmup_iters),
      ln_(register_module("ln", nn::LayerNorm(nn::LayerNormOptions({m.hidden})))),
      proj_(register_module(
          "proj", nn::Linear(nn::LinearOptions(m.hidden, m.vocab).bias(false)))) {}

void EarlyExitHead::Decide(const torch::Tensor& out, MicroBatchContext& ctx) {
  const int64_t b = out.size(0), t = out.size(1), c = out.size(2);
  const torch::Tensor active = ctx.token_active.defined()
                                   ? ctx.token_active
                                   : torch::ones({b, t}, out.options().dtype(torch::kBool));
  const ActiveTokens a = SelectTokens(active);
  const int64_t n = a.count();
  seen_ += n;
  if (n == 0) return;
  const torch::Tensor h = out.reshape({-1, c}).index_select(0, a.flat);
  const torch::Tensor log_probs = torch::log_softmax(proj_(ln_(h)), -1);
  const torch::Tensor targets = ctx.targets.reshape({-1}).index_select(0, a.flat);
  if (loss_weight_ > 0) {
    ctx.aux_losses.push_back(F::nll_loss(log_probs, targets) * loss_weight_);
  }
  if (ctx.iteration < warmup_iters_) return;  // nobody exits yet
  // CALM's softmax response, with no gradient: it only decides.
  const torch::Tensor confidence = std::get<0>(log_probs.detach().max(-1)).exp();
  // host-sync(model): per exit point and micro-batch after the warm-up: how many tokens
  //   leave is a dynamic shape (an unchanged mask is kept as it was, so the layers after it
  //   run the full batch, bit for bit as before); SelectTokens above waits once already,
  //   this second wait covers the exit head's projection
  const torch::Tensor leaving = a.flat.masked_select(confidence >= threshold_);
  const int64_t left = leaving.size(0);
  exited_ += left;
  if (left == 0) return;  // the mask stays as it was
  torch::Tensor next = active.reshape({-1}).clone();
  next.index_fill_(0, leaving, false);
  ctx.token_active = next.view({b, t});
}

std::pair<int64_t, int64_t> EarlyExitHead::TakeCounts() {
  std::pair<int64_t, int64_t> counts{seen_, exited_};
  seen_ = exited_ = 0;
  return counts;
}

torch::Tensor TokenMaskToWire(const torch::Tensor& active, int64_t b, int64_t t,
                              torch::Device device) {
  if (!active.defined()) {
    return torch::ones({b, t}, torch::TensorOptions(torch::kUInt8).device(device));
  }
  return active.to(torch::kUInt8).contiguous();
}

torch::Tensor TokenMaskFromWire(const torch::Tensor& wire) {
  // host-sync(model): once per micro-batch at a stage boundary: whether every token is still
  //   active decides if a mask is applied at all (a dynamic shape downstream)
  if (wire.all().item<bool>()) return torch::Tensor();
  return wire.to(torch::kBool);
}

}  // namespace dynmo::trainer
