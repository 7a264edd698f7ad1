#include "wire/report_codec.h"

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "wire/limits.h"

namespace dynmo::wire {
namespace {

bool Seconds(double v) { return core::FiniteNonNegative(v) && v <= kMaxLayerSeconds; }
bool Bytes(int64_t v) { return v >= 0 && v <= kMaxBytes; }

}  // namespace

absl::StatusOr<std::vector<core::LayerCost>> ReadReport(
    const dynmo::v1::IterationReport& report, int num_layers) {
  if (report.iteration() < 0 || report.iteration() > kMaxIteration) {
    return absl::InvalidArgumentError(
        absl::StrCat("iteration must be in [0, ", kMaxIteration, "]"));
  }
  if (report.applied_epoch() > kMaxEpoch) {
    return absl::InvalidArgumentError(absl::StrCat("applied_epoch must be <= ", kMaxEpoch));
  }
  if (!Seconds(report.probe_s())) {
    return absl::InvalidArgumentError(
        absl::StrCat("probe_s must be finite, >= 0 and <= ", kMaxLayerSeconds, " s"));
  }
  if (report.layers_size() > num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "report carries ", report.layers_size(), " layers but the job has ", num_layers));
  }
  std::vector<core::LayerCost> layers;
  layers.reserve(static_cast<size_t>(report.layers_size()));
  std::vector<bool> seen(static_cast<size_t>(num_layers), false);
  for (const auto& l : report.layers()) {
    if (l.layer() < 0 || l.layer() >= num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l.layer(), " outside [0, ", num_layers, ")"));
    }
    if (seen[static_cast<size_t>(l.layer())]) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l.layer(), " reported twice"));
    }
    seen[static_cast<size_t>(l.layer())] = true;
    if (!Seconds(l.fwd_s()) || !Seconds(l.bwd_s()) || !Seconds(l.wgrad_s())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", l.layer(), ": times must be finite, >= 0 and <= ", kMaxLayerSeconds, " s"));
    }
    if (!Bytes(l.params()) || !Bytes(l.resident_bytes()) || !Bytes(l.activation_bytes())) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l.layer(), ": parameters and byte counts must be in [0, ",
                       kMaxBytes, "]"));
    }
    core::LayerCost& c = layers.emplace_back();
    c.id = l.layer();
    c.fwd_s = l.fwd_s();
    c.bwd_s = l.bwd_s();
    c.wgrad_s = l.wgrad_s();
    c.params = l.params();
    c.resident_bytes = l.resident_bytes();
    c.activation_bytes = l.activation_bytes();
  }
  if (!Bytes(report.stage_memory_used_bytes()) ||
      !Bytes(report.stage_memory_capacity_bytes())) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage memory must be in [0, ", kMaxBytes, "]"));
  }
  if (!Seconds(report.neighbour_wait_s())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "neighbour_wait_s must be finite, >= 0 and <= ", kMaxLayerSeconds));
  }
  if (!Seconds(report.exchange_s())) {
    return absl::InvalidArgumentError(
        absl::StrCat("exchange_s must be finite, >= 0 and <= ", kMaxLayerSeconds));
  }
  return layers;
}

}  // namespace dynmo::wire
