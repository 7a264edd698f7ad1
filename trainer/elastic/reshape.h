// Elastic re-shaping in dynmo-train: carrying out one ReshapeStep
// (reshape_layout.h) at an iteration boundary, on every rank of the job:
//   1. the layer copies, in their rounds, over the CURRENT transport: each
//      layer's whole LayerState (weights, AdamW state, the layer's own
//      dynamic state: pruned CSR tensors, masks, metadata) as live
//      migration sends it (layer_state.h);
//   2. a new generation of c10d groups for the new grid
//      (Transport::Reshape: the world and the dp' data-parallel groups);
//   3. the stage regrouped: its new stage index, neighbours, replica, layers
//      and micro-batches per replica (PipelineStage::Regroup);
//   4. a check that the replicas of every stage now hold identical state:
//      every rank's CRC-32 of its layers' encoded LayerStates, gathered over
//      the world; replicas that differ are an error.
// Not thread-safe: the rank's training thread.
#ifndef DYNMO_TRAINER_ELASTIC_RESHAPE_H_
#define DYNMO_TRAINER_ELASTIC_RESHAPE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/comm/transport.h"
#include "trainer/config/config.h"
#include "trainer/layout/reshape_layout.h"
#include "trainer/stage/pipeline_stage.h"

namespace dynmo::trainer {

struct ReshapeResult {
  // Per new stage: the CRC-32 every replica of it holds.
  std::vector<uint32_t> stage_checksums;
  int64_t bytes_sent = 0;  // this rank's copies, encoded state bytes
};

// Applies `step` (see above). `*transport` becomes the new grid's transport.
// Every rank of the current transport must call it with the same step;
// `config` builds the received layers (its device).
absl::StatusOr<ReshapeResult> ApplyReshapeStep(const ReshapeStep& step,
                                               const TrainerConfig& config,
                                               PipelineStage& stage,
                                               std::unique_ptr<Transport>* transport);

// CRC-32 (zlib) of `layers`' encoded LayerStates, in order.
uint32_t LayersChecksum(const std::vector<OwnedLayer>& layers);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_ELASTIC_RESHAPE_H_
