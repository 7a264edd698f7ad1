#include "trainer/comm/variable_all_gather.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dynmo::trainer {

absl::StatusOr<std::vector<torch::Tensor>> AllGatherVariable(Transport& transport,
                                                             const torch::Tensor& local) {
  if (local.dim() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllGatherVariable takes a 1-D tensor, got ", local.dim(), " dims"));
  }
  torch::Tensor length = torch::full({1}, local.numel(), torch::kLong);
  std::vector<torch::Tensor> lengths;
  // host-sync(event): pruning: the lengths of every rank, gathered to size the padded
  //   all-gather
  if (absl::Status s = transport.AllGatherWorld(length, lengths); !s.ok()) return s;
  int64_t longest = 0;
  // host-sync(event): pruning: the gathered lengths size the padded all-gather
  for (const torch::Tensor& l : lengths) longest = std::max(longest, l.item<int64_t>());
  torch::Tensor padded = torch::zeros({std::max<int64_t>(longest, 1)}, local.options());
  if (local.numel() > 0) padded.narrow(0, 0, local.numel()).copy_(local);
  std::vector<torch::Tensor> gathered;
  // host-sync(event): pruning: the padded values, gathered
  if (absl::Status s = transport.AllGatherWorld(padded, gathered); !s.ok()) return s;
  std::vector<torch::Tensor> out;
  out.reserve(gathered.size());
  for (size_t r = 0; r < gathered.size(); ++r) {
    // host-sync(event): pruning: each rank's length trims its gathered slice
    out.push_back(gathered[r].narrow(0, 0, lengths[r].item<int64_t>()).clone());
  }
  return out;
}

}  // namespace dynmo::trainer
