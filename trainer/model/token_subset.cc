#include "trainer/model/token_subset.h"

#include <algorithm>

namespace dynmo::trainer {

TokenSubset SelectTokens(const torch::Tensor& chosen) {
  const int64_t b = chosen.size(0), t = chosen.size(1);
  const torch::Tensor picked = chosen.to(torch::kLong);
  TokenSubset s;
  // host-sync(model): per layer that runs on a token subset (MoD, early exit): the B rows'
  //   chosen counts, read once, size the gathered batch (its total) and the packed rows (the
  //   widest): dynamic shapes; the indices then come without another wait
  const torch::Tensor per_row = picked.sum(1).to(torch::kCPU);
  const auto rows = per_row.accessor<int64_t, 1>();
  int64_t total = 0;
  for (int64_t i = 0; i < b; ++i) {
    total += rows[i];
    s.width = std::max(s.width, rows[i]);
  }
  s.flat = torch::nonzero_static(chosen.reshape({-1}), total).reshape({-1});
  s.batch = torch::div(s.flat, t, "floor");
  s.pos = s.flat - s.batch * t;
  // A chosen token's slot in its sequence: how many chosen tokens precede it.
  const torch::Tensor rank = (picked.cumsum(1) - 1).reshape({-1}).index_select(0, s.flat);
  s.slot = s.batch * s.width + rank;
  s.slot_pos = torch::full({b * s.width}, t - 1, picked.options())
                   .index_copy_(0, s.slot, s.pos)
                   .view({b, s.width});
  return s;
}

}  // namespace dynmo::trainer
