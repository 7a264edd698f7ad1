// Moving one pipeline layer between ranks: everything the layer owns — its
// parameters (weights, biases, norms) and, per parameter, its AdamW state
// (exp_avg, exp_avg_sq, step) — goes over the transport as exact bytes, so
// the receiving rank continues training bit-identically. Buffers (the
// causal mask) are constants of the model shape and are rebuilt, not sent.
// Gradients are not sent: migrations happen at iteration boundaries, where
// the next iteration zeroes them anyway.
//
// Both ends must call with the same layer id; messages between one pair of
// ranks are matched in order, so a migration plan walked in the same order
// by every rank (core/migration.h) pairs every send with its receive.
#ifndef DYNMO_TRAINER_LAYER_MIGRATION_H_
#define DYNMO_TRAINER_LAYER_MIGRATION_H_

#include <torch/torch.h>

#include <memory>

#include "absl/status/statusor.h"
#include "trainer/config.h"
#include "trainer/gpt_layers.h"
#include "trainer/transport.h"

namespace dynmo::trainer {

// A layer together with the optimizer that owns its state.
struct OwnedLayer {
  std::shared_ptr<PipelineLayer> layer;
  std::unique_ptr<torch::optim::AdamW> optimizer;
};

// A fresh layer `id` with its own AdamW (no state yet).
OwnedLayer MakeOwnedLayer(const TrainerConfig& config, int id);

// Sends `owned`'s parameters and optimizer state to `peer`.
absl::Status SendLayer(Transport& transport, OwnedLayer& owned, int peer);

// Receives layer `id` from `peer` (the sender's SendLayer).
absl::StatusOr<OwnedLayer> RecvLayer(Transport& transport,
                                     const TrainerConfig& config, int id,
                                     int peer);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_LAYER_MIGRATION_H_
