// TokenSubset: some of a micro-batch's tokens, chosen by a [B, T] bool mask,
// in two layouts the token-skipping schemes compute on:
//
//   flat    [n] rows of the [B·T, H] hidden states, ascending (sample,
//           then position): gather, compute per token, scatter back.
//   packed  [B, width] slots, width = the most tokens any one sequence has:
//           sequence b's chosen tokens fill its first slots in causal order,
//           padding fills the rest. Batched attention runs on it; since the
//           real tokens come first, a causal mask over slots (or over
//           positions) keeps every real token from seeing the padding.
//
// Early exit (early_exit.h) uses it for the tokens in flight, Mixture of
// Depths (mixture_of_depths.h) for the tokens its predictor routes.
// A value type; building one reads the mask on the host (one sync).
#ifndef DYNMO_TRAINER_MODEL_TOKEN_SUBSET_H_
#define DYNMO_TRAINER_MODEL_TOKEN_SUBSET_H_

#include <torch/torch.h>

#include <cstdint>

namespace dynmo::trainer {

struct TokenSubset {
  torch::Tensor flat;   // [n] int64 b·T + t of each chosen token, ascending
  torch::Tensor batch;  // [n] int64 sample of each
  torch::Tensor pos;    // [n] int64 position of each
  // The packed layout.
  int64_t width = 0;        // slots per sequence (0 when n = 0)
  torch::Tensor slot;       // [n] int64 b·width + j: each token's slot
  torch::Tensor slot_pos;   // [B, width] int64 position in each slot; T-1 in padding
  int64_t count() const { return flat.size(0); }
};

// The tokens where `chosen` [B, T] (bool) is true.
TokenSubset SelectTokens(const torch::Tensor& chosen);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_MODEL_TOKEN_SUBSET_H_
