#include "trainer/dynamism/global_magnitude_threshold.h"

#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "trainer/comm/variable_all_gather.h"

namespace dynmo::trainer {
namespace {

float FloatFromBits(int64_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits);
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace

absl::StatusOr<GlobalThresholdResult> GlobalKeepThreshold(Transport& transport,
                                                          const torch::Tensor& magnitudes,
                                                          int64_t keep,
                                                          int64_t max_candidates) {
  // Round 0: every rank's count and whether its input is valid, so that a
  // bad input on one rank fails all of them instead of hanging the others.
  bool valid = magnitudes.dim() == 1 && magnitudes.scalar_type() == torch::kFloat;
  torch::Tensor mags;
  if (valid) {
    mags = magnitudes.contiguous();
    // NaN fails (x >= 0) as well as negatives do.
    // host-sync(event): a pruning step: input check of the magnitudes
    valid = mags.numel() == 0 || mags.ge(0).all().item<bool>();
  }
  torch::Tensor head = torch::zeros({2}, torch::kLong);
  head[0] = valid ? 0 : 1;
  head[1] = valid ? mags.numel() : 0;
  // host-sync(event): a pruning step: the world's counts and input checks
  if (absl::Status s = transport.AllReduceSumWorld(head); !s.ok()) return s;
  // host-sync(event): a pruning step: the world-wide counts after their all-reduce
  if (head[0].item<int64_t>() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        head[0].item<int64_t>(),
        " rank(s) passed magnitudes that are not a 1-D float tensor of values >= 0"));
  }
  GlobalThresholdResult result;
  // host-sync(event): a pruning step: the world-wide count
  result.total = head[1].item<int64_t>();
  if (keep >= result.total) {
    result.threshold = 0;
    return result;
  }
  if (keep <= 0) {
    result.threshold = std::numeric_limits<float>::infinity();
    return result;
  }

  // The bit patterns of non-negative floats, as int64 in [0, 2^31).
  torch::Tensor keys = mags.view(torch::kInt).to(torch::kLong);
  torch::Tensor values = mags;
  int64_t prefix = 0;  // the top `fixed` bits of the answer
  int fixed = 0;
  int64_t need = keep;  // rank of the answer among the entries under prefix
  for (const int width : {16, 8, 8}) {
    const int shift = 32 - fixed - width;
    torch::Tensor digit = keys.bitwise_right_shift(shift).bitwise_and((int64_t{1} << width) - 1);
    torch::Tensor hist = torch::bincount(digit, {}, int64_t{1} << width).to(torch::kLong);
    if (hist.numel() != (int64_t{1} << width)) {
      hist = torch::zeros({int64_t{1} << width}, torch::kLong);  // bincount of nothing
    }
    // host-sync(event): a pruning step: one histogram round of the radix select
    if (absl::Status s = transport.AllReduceSumWorld(hist); !s.ok()) return s;
    const int64_t* h = hist.data_ptr<int64_t>();
    int64_t above = 0, bucket = -1;
    for (int64_t b = (int64_t{1} << width) - 1; b >= 0; --b) {
      if (above + h[b] >= need) {
        bucket = b;
        break;
      }
      above += h[b];
    }
    if (bucket < 0) {
      return absl::InternalError("global threshold: histogram lost entries");
    }
    need -= above;
    prefix = (prefix << width) | bucket;
    fixed += width;
    torch::Tensor in_bucket = digit.eq(bucket);
    // host-sync(event): a pruning step: the entries left in the chosen bucket
    keys = keys.masked_select(in_bucket);
    values = values.masked_select(in_bucket);
    if (fixed == 32) {  // every entry left equals the answer
      result.threshold = FloatFromBits(prefix);
      return result;
    }
    if (h[bucket] <= max_candidates) break;
  }
  absl::StatusOr<std::vector<torch::Tensor>> gathered = AllGatherVariable(transport, values);
  if (!gathered.ok()) return gathered.status();
  torch::Tensor candidates = torch::cat(*gathered);
  result.candidates_exchanged = candidates.numel();
  if (need > candidates.numel()) {
    return absl::InternalError("global threshold: fewer candidates than counted");
  }
  torch::Tensor sorted = std::get<0>(candidates.sort(/*dim=*/0, /*descending=*/true));
  // host-sync(event): a pruning step: the threshold itself
  result.threshold = sorted[need - 1].item<float>();
  return result;
}

}  // namespace dynmo::trainer
