#include "trainer/elastic/reshape.h"

#include <zlib.h>

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "trainer/comm/device.h"
#include "trainer/state/layer_state.h"

namespace dynmo::trainer {

uint32_t LayersChecksum(const std::vector<OwnedLayer>& layers) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const OwnedLayer& owned : layers) {
    const torch::Tensor bytes = EncodeLayerState(CaptureLayerState(owned)).contiguous();
    crc = crc32(crc, bytes.data_ptr<uint8_t>(), static_cast<uInt>(bytes.numel()));
  }
  return static_cast<uint32_t>(crc);
}

namespace {

// Gathers every rank's checksum and checks the replicas of each stage agree.
absl::StatusOr<std::vector<uint32_t>> CheckReplicas(const ReshapeStep& step,
                                                    uint32_t mine,
                                                    Transport& transport) {
  torch::Tensor t = torch::full({1}, static_cast<int64_t>(mine), torch::kLong);
  std::vector<torch::Tensor> all;
  // host-sync(event): a re-shape: every rank's state checksum
  if (absl::Status s = transport.AllGatherWorld(t, all); !s.ok()) return s;
  std::vector<uint32_t> per_stage(static_cast<size_t>(step.to_pp()), 0);
  for (int p = 0; p < step.ranks(); ++p) {
    // host-sync(event): a re-shape: the replicas' state checksums, compared once
    const uint32_t crc = static_cast<uint32_t>(all[static_cast<size_t>(p)].item<int64_t>());
    const size_t stage = static_cast<size_t>(step.stage_after[static_cast<size_t>(p)]);
    const int replica = step.replica_after[static_cast<size_t>(p)];
    if (replica == 0) {
      per_stage[stage] = crc;
    } else if (crc != per_stage[stage]) {
      return absl::InternalError(absl::StrCat(
          "after re-shaping, replica ", replica, " of stage ", stage, " (rank ", p,
          ") holds state CRC-32 ", crc, " but replica 0 holds ", per_stage[stage]));
    }
  }
  return per_stage;
}

}  // namespace

absl::StatusOr<ReshapeResult> ApplyReshapeStep(const ReshapeStep& step,
                                               const TrainerConfig& config,
                                               PipelineStage& stage,
                                               std::unique_ptr<Transport>* transport) {
  Transport& current = **transport;
  const int me = current.rank();
  if (current.world_size() != step.ranks()) {
    return absl::InternalError(absl::StrCat("re-shape step over ", step.ranks(),
                                            " ranks on a transport of ",
                                            current.world_size()));
  }
  ReshapeResult result;
  std::map<int, OwnedLayer> held;
  for (OwnedLayer& owned : stage.layers()) {
    const int id = owned.layer->id();
    held[id] = std::move(owned);
  }
  stage.layers().clear();
  std::map<int, OwnedLayer> received;
  for (const LayerCopy& c : step.copies) {
    if (c.from_rank == me) {
      auto it = held.find(c.layer);
      if (it == held.end()) {
        return absl::InternalError(
            absl::StrCat("rank ", me, " is asked to send layer ", c.layer,
                         " it does not hold"));
      }
      const LayerState state = CaptureLayerState(it->second);
      result.bytes_sent += state.PayloadBytes();
      if (absl::Status s = SendLayerState(current, state, c.to_rank); !s.ok()) return s;
    } else if (c.to_rank == me) {
      absl::StatusOr<LayerState> state =
          RecvLayerState(current, c.layer, c.from_rank, DeviceOf(config));
      if (!state.ok()) return state.status();
      absl::StatusOr<OwnedLayer> owned = RestoreLayer(config, *state);
      if (!owned.ok()) return owned.status();
      received[c.layer] = *std::move(owned);
    }
  }
  std::vector<OwnedLayer> layers;
  const int first = step.first_layer_after[static_cast<size_t>(me)];
  const int last = step.last_layer_after[static_cast<size_t>(me)];
  for (int l = first; l < last; ++l) {
    std::map<int, OwnedLayer>& from = received.count(l) ? received : held;
    auto it = from.find(l);
    if (it == from.end()) {
      return absl::InternalError(
          absl::StrCat("after re-shaping rank ", me, " lacks layer ", l));
    }
    layers.push_back(std::move(it->second));
  }
  absl::StatusOr<std::unique_ptr<Transport>> next = current.Reshape(step.to_dp);
  if (!next.ok()) return next.status();
  stage.Regroup(step.stage_after[static_cast<size_t>(me)], step.to_pp(), step.to_dp,
                step.replica_after[static_cast<size_t>(me)], step.to_microbatches,
                std::move(layers), next->get());
  *transport = *std::move(next);
  absl::StatusOr<std::vector<uint32_t>> checksums =
      CheckReplicas(step, LayersChecksum(stage.layers()), **transport);
  if (!checksums.ok()) return checksums.status();
  result.stage_checksums = *std::move(checksums);
  return result;
}

}  // namespace dynmo::trainer
