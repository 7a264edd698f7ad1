#include "trainer/model/token_subset.h"

namespace dynmo::trainer {

TokenSubset SelectTokens(const torch::Tensor& chosen) {
  const int64_t b = chosen.size(0), t = chosen.size(1);
  const torch::Tensor picked = chosen.to(torch::kLong);
  TokenSubset s;
  // host-sync(steady): per layer that runs on a token subset (MoD, early exit): the chosen tokens
  //   and the widest row size the gathered batch (dynamic shapes)
  s.flat = chosen.reshape({-1}).nonzero().reshape({-1});
  s.batch = torch::div(s.flat, t, "floor");
  s.pos = s.flat - s.batch * t;
  s.width = b == 0 || t == 0 ? 0 : picked.sum(1).max().item<int64_t>();
  // A chosen token's slot in its sequence: how many chosen tokens precede it.
  const torch::Tensor rank = (picked.cumsum(1) - 1).reshape({-1}).index_select(0, s.flat);
  s.slot = s.batch * s.width + rank;
  s.slot_pos = torch::full({b * s.width}, t - 1, picked.options())
                   .index_copy_(0, s.slot, s.pos)
                   .view({b, s.width});
  return s;
}

}  // namespace dynmo::trainer
