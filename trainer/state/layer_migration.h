// Moving one pipeline layer between ranks: its whole LayerState
// (layer_state.h) — every named parameter and buffer with its shape and
// dtype, the AdamW state per parameter (step, exp_avg, exp_avg_sq) and the
// layer's metadata — goes over the transport as exact bytes, so the
// receiving rank continues training bit-identically, also for layers whose
// tensors changed size while training (pruned weights stored as CSR).
// Gradients are not sent: migrations happen at iteration boundaries, where
// the next iteration zeroes them.
//
// Both ends must call with the same layer id; messages between one pair of
// ranks are matched in order, so a migration plan walked in the same order
// by every rank (core/migration.h) pairs every send with its receive.
#ifndef DYNMO_TRAINER_STATE_LAYER_MIGRATION_H_
#define DYNMO_TRAINER_STATE_LAYER_MIGRATION_H_

#include "absl/status/statusor.h"
#include "trainer/comm/transport.h"
#include "trainer/config/config.h"
#include "trainer/state/layer_state.h"

namespace dynmo::trainer {

// Sends `owned`'s state to `peer`.
absl::Status SendLayer(Transport& transport, OwnedLayer& owned, int peer);

// Receives layer `id` from `peer` (the sender's SendLayer) and rebuilds it.
absl::StatusOr<OwnedLayer> RecvLayer(Transport& transport,
                                     const TrainerConfig& config, int id,
                                     int peer);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_STATE_LAYER_MIGRATION_H_
