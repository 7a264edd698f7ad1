#include "trainer/state/layer_migration.h"

#include "absl/strings/str_cat.h"
#include "trainer/comm/device.h"

namespace dynmo::trainer {

absl::Status SendLayer(Transport& transport, OwnedLayer& owned, int peer) {
  return SendLayerState(transport, CaptureLayerState(owned), peer);
}

absl::StatusOr<OwnedLayer> RecvLayer(Transport& transport,
                                     const TrainerConfig& config, int id,
                                     int peer) {
  absl::StatusOr<LayerState> state = RecvLayerState(transport, peer, DeviceOf(config));
  if (!state.ok()) return state.status();
  if (state->id != id) {
    return absl::InternalError(absl::StrCat("expected layer ", id, " from rank ", peer,
                                            ", got layer ", state->id));
  }
  return RestoreLayer(config, *state);
}

}  // namespace dynmo::trainer
