// AllGatherVariable: every rank contributes a 1-D tensor of its own length
// and every rank receives all of them, in rank order — the exchange the
// distributed global pruning needs (each stage holds a different number of
// candidate weights, and no rank knows the others' counts in advance).
//
// Built on the Transport seam's equal-shape AllGatherWorld, so it is
// backend-neutral: the lengths go first (one int64 per rank), then every
// rank's tensor padded to the longest, trimmed again on arrival. Costs two
// all-gathers; the padding is at most (world - 1) x the longest tensor.
// A collective: every rank of the transport must call it, with the same
// dtype. Not thread-safe (one thread drives a transport).
#ifndef DYNMO_TRAINER_COMM_VARIABLE_ALL_GATHER_H_
#define DYNMO_TRAINER_COMM_VARIABLE_ALL_GATHER_H_

#include <torch/torch.h>

#include <vector>

#include "absl/status/statusor.h"
#include "trainer/comm/transport.h"

namespace dynmo::trainer {

// Returns world_size tensors, entry r being rank r's `local` (1-D, CPU).
// INVALID_ARGUMENT when `local` is not 1-D.
absl::StatusOr<std::vector<torch::Tensor>> AllGatherVariable(Transport& transport,
                                                             const torch::Tensor& local);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_COMM_VARIABLE_ALL_GATHER_H_
