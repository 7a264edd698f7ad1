#include "core/cost_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace dynmo::core {

bool FiniteNonNegative(double v) { return std::isfinite(v) && v >= 0; }

absl::Status ValidateModel(const PipelineModel& model) {
  if (model.stages.empty()) {
    return absl::InvalidArgumentError("the pipeline has no stages");
  }
  if (model.layers.empty()) {
    return absl::InvalidArgumentError("the model has no layers");
  }
  for (size_t i = 0; i < model.layers.size(); ++i) {
    const LayerCost& l = model.layers[i];
    if (l.id != static_cast<int>(i)) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer at position ", i, " has id ", l.id,
                       "; ids must be 0..n-1 in pipeline order"));
    }
    if (!FiniteNonNegative(l.fwd_s) || !FiniteNonNegative(l.bwd_s) ||
        !FiniteNonNegative(l.wgrad_s)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", i, " has a negative or non-finite time (fwd=", l.fwd_s,
          " bwd=", l.bwd_s, " wgrad=", l.wgrad_s, ")"));
    }
    if (l.params < 0 || l.resident_bytes < 0 || l.activation_bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", i, " has a negative size"));
    }
  }
  for (size_t s = 0; s < model.stages.size(); ++s) {
    const StageSpec& st = model.stages[s];
    if (!std::isfinite(st.speed) || st.speed <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage ", s, " has speed ", st.speed, "; speeds must be > 0"));
    }
    if (!FiniteNonNegative(st.exchange_s)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage ", s, " has exchange_s ", st.exchange_s, "; must be finite and >= 0"));
    }
    if (st.inflight_microbatches < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage ", s, " has negative in-flight micro-batches"));
    }
  }
  const LinkSpec& link = model.link;
  if (link.boundary_bytes < 0 || !FiniteNonNegative(link.bandwidth_bytes_per_s)) {
    return absl::InvalidArgumentError(
        "the link needs non-negative boundary bytes and bandwidth");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LayerCost>> CombineReplicaProfiles(
    absl::Span<const std::vector<LayerCost>> replicas) {
  if (replicas.empty()) {
    return absl::InvalidArgumentError("no replica profiles to combine");
  }
  std::vector<LayerCost> out = replicas[0];
  for (size_t r = 1; r < replicas.size(); ++r) {
    if (replicas[r].size() != out.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "replica ", r, " reports ", replicas[r].size(),
          " layers; replica 0 reports ", out.size()));
    }
    for (size_t i = 0; i < out.size(); ++i) {
      const LayerCost& l = replicas[r][i];
      LayerCost& o = out[i];
      o.fwd_s = std::max(o.fwd_s, l.fwd_s);
      o.bwd_s = std::max(o.bwd_s, l.bwd_s);
      o.wgrad_s = std::max(o.wgrad_s, l.wgrad_s);
      o.params = std::max(o.params, l.params);
      o.resident_bytes = std::max(o.resident_bytes, l.resident_bytes);
      o.activation_bytes = std::max(o.activation_bytes, l.activation_bytes);
    }
  }
  return out;
}

LayerPrefix::LayerPrefix(absl::Span<const LayerCost> layers) {
  const size_t n = layers.size();
  time_.assign(n + 1, 0);
  fwd_.assign(n + 1, 0);
  bwd_.assign(n + 1, 0);
  wgrad_.assign(n + 1, 0);
  params_.assign(n + 1, 0);
  resident_.assign(n + 1, 0);
  act_.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    time_[i + 1] = time_[i] + layers[i].time_s();
    fwd_[i + 1] = fwd_[i] + layers[i].fwd_s;
    bwd_[i + 1] = bwd_[i] + layers[i].bwd_s;
    wgrad_[i + 1] = wgrad_[i] + layers[i].wgrad_s;
    params_[i + 1] = params_[i] + layers[i].params;
    resident_[i + 1] = resident_[i] + layers[i].resident_bytes;
    act_[i + 1] = act_[i] + layers[i].activation_bytes;
  }
}

double StageTime(const LayerPrefix& prefix, const StageSpec& stage,
                 const LinkSpec& link, int s, int num_stages, int i, int j) {
  double t = (prefix.time(i, j) + stage.exchange_s) / stage.speed;
  if (s + 1 < num_stages) t += link.exposed_transfer_s();
  return t;
}

int64_t StageMemory(const LayerPrefix& prefix, const StageSpec& stage, int i,
                    int j) {
  return prefix.resident(i, j) +
         static_cast<int64_t>(stage.inflight_microbatches) *
             prefix.activation(i, j);
}

bool FitsMemory(const LayerPrefix& prefix, const StageSpec& stage, int i,
                int j) {
  return stage.capacity_bytes < 0 ||
         StageMemory(prefix, stage, i, j) <= stage.capacity_bytes;
}

}  // namespace dynmo::core
