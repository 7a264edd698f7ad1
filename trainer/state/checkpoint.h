// Per-layer, partition-independent checkpoints: each stage writes the layers
// it holds, one LayerState file per layer (layer_state.h: parameters,
// buffers, AdamW state, metadata), and rank 0 marks the checkpoint complete
// with its manifest (checkpoint_manifest.h) after a barrier. Because a file
// holds one layer, not one stage, a job resumes at any pp and dp: each rank
// loads the layers of its own stage.
//
//   save:   SaveStageLayers (dp replica 0 of every stage) -> Barrier ->
//           WriteManifest (rank 0)
//   resume: FindLatestCheckpoint + CheckResumable (every rank, before it
//           connects) -> LoadStageLayers (every rank, its own slice)
//
// Thread-compatible; called at iteration boundaries by the training thread.
#ifndef DYNMO_TRAINER_STATE_CHECKPOINT_H_
#define DYNMO_TRAINER_STATE_CHECKPOINT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainer/comm/transport.h"
#include "trainer/config/config.h"
#include "trainer/state/checkpoint_manifest.h"
#include "trainer/state/layer_state.h"

namespace dynmo::trainer {

// Creates `dir` (and its parent) if needed and writes every layer of
// `layers` to LayerStatePath(dir, id), each atomically.
absl::Status SaveStageLayers(const std::string& dir, const std::vector<OwnedLayer>& layers);

// Layers [first, last) of `config`'s model from `dir`, restored with their
// optimizer state. Errors name the file at fault.
absl::StatusOr<std::vector<OwnedLayer>> LoadStageLayers(const std::string& dir,
                                                        const TrainerConfig& config,
                                                        int first, int last);

// One rank's part of a save into `dir`: its layers when `write_layers` (dp
// replica 0 of each stage; the replicas hold the same state), then a
// barrier of the whole job, then the manifest when `manifest` is given
// (rank 0). Every rank of the job must call it.
absl::Status SaveCheckpoint(Transport& transport, const std::string& dir,
                            const std::vector<OwnedLayer>& layers, bool write_layers,
                            const CheckpointManifest* manifest);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_STATE_CHECKPOINT_H_
