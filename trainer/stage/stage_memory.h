// How much memory one rank's stage uses, from tensor sizes (numel x element
// size; no allocator hooks), and how much it may use. Reported to the
// coordinator per iteration (agent::IterationSample memory_used_bytes /
// memory_capacity_bytes) and logged per stage (`stage_memory_bytes`).
//
//   used = sum over the rank's layers of LayerResidentBytes
//        + the peak bytes of activations the stage stashed between a
//          micro-batch's forward and its backward during the iteration
//          (PipelineStage: the distinct storages of each in-flight micro-
//          batch's received input, layer inputs and layer outputs; autograd's
//          own saved intermediates inside a layer are not visible there and
//          are not counted, so this is a lower bound on activation memory).
//   LayerResidentBytes = parameters + buffers
//                      + a gradient per parameter that requires one,
//                        allocated now or not (zero_grad frees them; the
//                        next backward's peak holds them again)
//                      + AdamW state (exp_avg, exp_avg_sq, max_exp_avg_sq):
//                        what a migration or a checkpoint of it carries,
//                        plus its gradients.
//   activation bytes per layer and micro-batch: measured by the allocators
//   (activation_meter.h), reported per layer next to LayerResidentBytes.
//   capacity = --memory_capacity_gb, else the machine's physical memory
//              (sysconf) divided by the ranks on this host
//              (LOCAL_WORLD_SIZE, else WORLD_SIZE, else 1).
// On a GPU both come from the device instead (trainer/comm/device_share.h):
// used = the caching allocator's reserved peak + this rank's share of the
// context and NCCL buffers; capacity = the device / the ranks sharing it
// (found by device UUID).
#ifndef DYNMO_TRAINER_STAGE_STAGE_MEMORY_H_
#define DYNMO_TRAINER_STAGE_STAGE_MEMORY_H_

#include <cstdint>

#include "trainer/state/layer_state.h"

namespace dynmo::trainer {

int64_t LayerResidentBytes(const OwnedLayer& owned);

// Parameters the layer still has: all of them, less what pruning removed (a
// CSR weight holds only its survivors; a masked one counts what its mask
// keeps). What the `parameters` balancer balances. Reads each mask's count
// (a device sync on cuda): call it when the model changed, not per step.
int64_t LayerNonZeroParameters(const OwnedLayer& owned);

// Physical memory / local ranks (see above).
int64_t DefaultMemoryCapacityBytes();

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_STAGE_STAGE_MEMORY_H_
