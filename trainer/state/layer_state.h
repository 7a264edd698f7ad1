// LayerState: everything one pipeline layer owns, as named tensors, in one
// encoding shared by live migration (SendLayerState / RecvLayerState, below)
// and per-layer checkpoints (checkpoint.h), so a layer that survives one
// survives the other.
//
// A layer's state is
//   - every named parameter and every named buffer of the module (the names
//     torch::nn::Module::named_parameters / named_buffers give, e.g.
//     "qkv.weight", "causal_mask"), each with its own dtype and shape, so
//     tensors whose size changes while training (a pruned weight kept as
//     CSR values / col_idx / row_ptr buffers of varying length) travel as
//     they are;
//   - per parameter the optimizer has stepped, its AdamW state: step,
//     exp_avg, exp_avg_sq (and max_exp_avg_sq under amsgrad);
//   - a small int64 metadata vector from layers that implement
//     LayerMetadataHook (a 'frozen' flag, a pruning level, ...); empty
//     otherwise.
// Gradients are not state: migrations and checkpoints happen at iteration
// boundaries, where the next iteration zeroes them.
//
// Restoring builds a fresh layer with MakeOwnedLayer (same id, same config),
// gives it the metadata first (so a layer can restructure itself, e.g.
// register the buffers of its pruned form), then replaces every tensor by
// name with Tensor::set_data (the parameter keeps its identity, so its
// optimizer still owns it, while its shape and dtype may change) and
// installs the AdamW state. A name one side has and the other lacks is an
// error: the two sides disagree on what the layer is. Bytes are copied
// exactly, so a restored layer trains on bit-identically.
//
// Encoding (one byte string, used as is on the wire and in the file):
//   "DYNMOLS1"   8-byte magic
//   uint64       header length H (host byte order: the job runs on one
//                architecture; checked through the magic's layout)
//   H bytes      JSON header {"id":..,"metadata":[..],
//                "tensors":[{"name":..,"role":..,"dtype":..,"shape":[..]},..],
//                "steps":{"<param>":step,..}}; role is param | buffer |
//                exp_avg | exp_avg_sq | max_exp_avg_sq (the last three name
//                the parameter they belong to)
//   payload      every tensor's contiguous bytes, back to back, header order
// In a file: the bytes, written to a temporary name and renamed into place.
// On a Transport there is no payload blob: one int64 tensor [H], the H
// header bytes as a uint8 tensor, then every tensor of the header, each
// sent from where it lives and received straight into a tensor allocated
// on the receiver's device (one batch of point-to-point operations), so a
// migration costs what the transport costs.
//
// Functions are thread-compatible; a layer must not be trained while its
// state is captured or restored.
#ifndef DYNMO_TRAINER_STATE_LAYER_STATE_H_
#define DYNMO_TRAINER_STATE_LAYER_STATE_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "trainer/comm/transport.h"
#include "trainer/config/config.h"
#include "trainer/model/gpt_layers.h"

namespace dynmo::trainer {

// A layer together with the optimizer that owns its state.
struct OwnedLayer {
  std::shared_ptr<PipelineLayer> layer;
  std::unique_ptr<torch::optim::AdamW> optimizer;
};

// A fresh layer `id` with its own AdamW (no state yet).
OwnedLayer MakeOwnedLayer(const TrainerConfig& config, int id);

// Implemented (by multiple inheritance) by a PipelineLayer whose state is
// more than its tensors. Restore runs on a fresh layer before any tensor is
// replaced; an error there fails the restore.
class LayerMetadataHook {
 public:
  virtual ~LayerMetadataHook() = default;
  virtual std::vector<int64_t> SaveMetadata() const = 0;
  virtual absl::Status RestoreMetadata(absl::Span<const int64_t> metadata) = 0;
};

struct NamedTensor {
  std::string name;
  torch::Tensor value;  // contiguous once captured or decoded; on the layer's
                        // device when captured or received, CPU when decoded
};

struct AdamWTensors {
  std::string param;  // the parameter's name
  int64_t step = 0;
  torch::Tensor exp_avg;
  torch::Tensor exp_avg_sq;
  torch::Tensor max_exp_avg_sq;  // undefined unless amsgrad
};

struct LayerState {
  int id = -1;
  std::vector<int64_t> metadata;
  std::vector<NamedTensor> parameters;
  std::vector<NamedTensor> buffers;
  std::vector<AdamWTensors> optimizer;  // parameters the optimizer has stepped
  // Bytes of every tensor above (the payload of the encoding).
  int64_t PayloadBytes() const;
};

// The layer's state; tensors alias the layer's own (detached), so encode or
// copy it before training goes on.
LayerState CaptureLayerState(const OwnedLayer& owned);

// A fresh layer state.id of `config` holding `state`. Errors
// (INVALID_ARGUMENT): names that do not match the fresh layer's, a rejected
// metadata vector.
absl::StatusOr<OwnedLayer> RestoreLayer(const TrainerConfig& config,
                                        const LayerState& state);
// The same on a layer the caller built (`fresh`, whose optimizer holds
// exactly its parameters): RestoreLayer is RestoreLayerInto(MakeOwnedLayer(
// config, state.id), state). The restored tensors share storage with
// `state`'s.
absl::StatusOr<OwnedLayer> RestoreLayerInto(OwnedLayer fresh, const LayerState& state);

// The encoding above, as a 1-D uint8 tensor.
torch::Tensor EncodeLayerState(const LayerState& state);
// Parses an encoding (copying the tensors out). Errors (DATA_LOSS): bad
// magic, truncated or malformed header or payload, unknown dtype or role.
absl::StatusOr<LayerState> DecodeLayerState(absl::Span<const uint8_t> bytes);

// Moving one layer between ranks: the sender sends
// CaptureLayerState(owned), the receiver restores what RecvLayerState gives
// (RestoreLayer), so the receiving rank trains on bit-identically. Both ends
// name the same layer; messages between one pair of ranks match in order,
// so a migration plan walked in the same order by every rank
// (core/migration.h) pairs every send with its receive.
absl::Status SendLayerState(Transport& transport, const LayerState& state,
                            int peer);
// Receives layer `id`'s state from `peer` onto `device`. INTERNAL when the
// peer sent another layer.
absl::StatusOr<LayerState> RecvLayerState(Transport& transport, int id, int peer,
                                          torch::Device device = torch::kCPU);

// Writes `state` to `path` atomically (temporary file in the same
// directory, then rename). Errors name the path.
absl::Status WriteLayerStateFile(const LayerState& state,
                                 const std::string& path);
absl::StatusOr<LayerState> ReadLayerStateFile(const std::string& path);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_STATE_LAYER_STATE_H_
