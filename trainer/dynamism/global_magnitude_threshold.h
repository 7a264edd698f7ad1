// The distributed global top-k of gradual global magnitude pruning (the
// paper's Algorithm 2, Appendix C.2) without any rank holding the model:
// every rank passes the magnitudes of ITS stored weights, and every rank
// gets back the same threshold t = the keep-th largest magnitude of the
// union over all ranks, so "keep |w| >= t" keeps the global top-keep.
//
// Algorithm 2 has rank 0 gather every rank's local top-k and scatter the
// indices to keep; at low sparsity that gathers nearly the whole model onto
// rank 0. Here the selection is a distributed radix select on the float's
// bit pattern (non-negative IEEE floats order like their bits):
//   1. histogram of the top 16 bits, summed over the ranks (one fixed-size
//      all-reduce): the bucket holding the keep-th largest is known to all;
//   2. while that bucket still holds more than `max_candidates` weights job
//      wide, the next 8 bits are histogrammed the same way;
//   3. the candidates left in the bucket — a different number per rank — are
//      exchanged with a variable-sized all-gather (variable_all_gather.h,
//      sizes first) and every rank sorts the same small set and reads t.
// Communication is a few histograms plus the candidates, never the model.
// Ties at t are all kept (a global count at most keep + ties).
//
// A collective over every rank of the transport, called with the same
// `keep`. Not thread-safe.
#ifndef DYNMO_TRAINER_DYNAMISM_GLOBAL_MAGNITUDE_THRESHOLD_H_
#define DYNMO_TRAINER_DYNAMISM_GLOBAL_MAGNITUDE_THRESHOLD_H_

#include <torch/torch.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "trainer/comm/transport.h"

namespace dynmo::trainer {

struct GlobalThresholdResult {
  float threshold = 0;  // keep weights with magnitude >= threshold
  int64_t total = 0;    // magnitudes over all ranks
  int64_t candidates_exchanged = 0;  // size of the final all-gather (all ranks)
};

// `magnitudes`: this rank's contribution, a 1-D float tensor of values >= 0
// (may be empty, e.g. a dp replica whose copy another replica contributes).
// keep >= total returns threshold 0 (keep all); keep <= 0 returns +inf.
// INVALID_ARGUMENT on any rank (all ranks return it) when some rank passed
// a negative or NaN magnitude or a tensor that is not 1-D float.
absl::StatusOr<GlobalThresholdResult> GlobalKeepThreshold(
    Transport& transport, const torch::Tensor& magnitudes, int64_t keep,
    int64_t max_candidates = int64_t{1} << 16);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_DYNAMISM_GLOBAL_MAGNITUDE_THRESHOLD_H_
