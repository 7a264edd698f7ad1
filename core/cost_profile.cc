#include "core/cost_profile.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/measures.h"

namespace dynmo::core {
namespace {

double Smooth(double old_v, double new_v, double w) {
  return w * new_v + (1 - w) * old_v;
}

int64_t Smooth64(int64_t old_v, int64_t new_v, double w) {
  return static_cast<int64_t>(std::llround(w * new_v + (1 - w) * old_v));
}

}  // namespace

CostProfile::CostProfile(int replicas, int num_layers,
                         const CostProfileOptions& options)
    : options_(options),
      num_layers_(std::max(num_layers, 0)),
      costs_(static_cast<size_t>(std::max(replicas, 0)),
             std::vector<LayerCost>(static_cast<size_t>(num_layers_))),
      seen_(costs_.size(),
            std::vector<bool>(static_cast<size_t>(num_layers_), false)),
      noise_(costs_.size(),
             std::vector<NoiseTracker>(static_cast<size_t>(num_layers_))),
      missing_(static_cast<int>(costs_.size()) * num_layers_) {
  for (auto& replica : costs_) {
    for (int i = 0; i < num_layers_; ++i) replica[static_cast<size_t>(i)].id = i;
  }
}

absl::Status CostProfile::Add(int replica, const LayerCost& sample,
                              bool model_changed) {
  if (replica < 0 || replica >= replicas()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replica ", replica, " outside the profile's ", replicas()));
  }
  if (sample.id < 0 || sample.id >= num_layers_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer ", sample.id, " outside the profile's ", num_layers_));
  }
  const size_t r = static_cast<size_t>(replica);
  const size_t i = static_cast<size_t>(sample.id);
  LayerCost& c = costs_[r][i];
  NoiseTracker& noise = noise_[r][i];
  if (model_changed) {
    noise.Restart(sample.time_s());
  } else {
    noise.Add(sample.time_s(), options_.noise_smoothing);
  }
  if (!seen_[r][i]) {
    seen_[r][i] = true;
    --missing_;
    c = sample;  // its id is the layer's
    return absl::OkStatus();
  }
  const double w = model_changed ? 1.0 : options_.smoothing;
  if (!noise.restarted() && noise.samples() == 2) {  // the job's second sample of it
    c.fwd_s = std::min(c.fwd_s, sample.fwd_s);
    c.bwd_s = std::min(c.bwd_s, sample.bwd_s);
    c.wgrad_s = std::min(c.wgrad_s, sample.wgrad_s);
    // Nor does their difference say how the layer's time scatters: its
    // spread starts from the kept cost (a first iteration 2.5x the steady
    // one left a spread that held the adapter's first plan ~30 iterations).
    noise.Recenter(c.time_s());
  } else {
    c.fwd_s = Smooth(c.fwd_s, sample.fwd_s, w);
    c.bwd_s = Smooth(c.bwd_s, sample.bwd_s, w);
    c.wgrad_s = Smooth(c.wgrad_s, sample.wgrad_s, w);
  }
  c.params = sample.params;
  c.resident_bytes = Smooth64(c.resident_bytes, sample.resident_bytes, w);
  c.activation_bytes = Smooth64(c.activation_bytes, sample.activation_bytes, w);
  return absl::OkStatus();
}

absl::StatusOr<PipelineModel> CostProfile::Model(
    const PipelineShape& shape) const {
  if (missing_ > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no complete profile yet: ", missing_, " of ",
        replicas() * num_layers_, " (replica, layer) samples missing"));
  }
  absl::StatusOr<std::vector<LayerCost>> layers = CombineReplicaProfiles(costs_);
  if (!layers.ok()) return layers.status();
  PipelineModel model;
  model.layers = *std::move(layers);
  const int stages = static_cast<int>(shape.stages.size());
  const int inflight = shape.schedule == Schedule::kGPipe
                           ? shape.microbatches
                           : std::min(shape.microbatches, stages);
  for (const StageMemoryReport& reported : shape.stages) {
    StageSpec spec;
    spec.capacity_bytes = reported.capacity_bytes;
    spec.inflight_microbatches = inflight;
    model.stages.push_back(spec);
  }
  if (ValidateBoundaries(shape.boundaries, num_layers_, stages).ok()) {
    const std::vector<int64_t> predicted =
        StageMemoryUse(model, shape.boundaries);
    for (size_t s = 0; s < model.stages.size(); ++s) {
      int64_t& cap = model.stages[s].capacity_bytes;
      const int64_t unexplained = shape.stages[s].used_bytes - predicted[s];
      if (cap >= 0 && unexplained > 0) cap = std::max<int64_t>(0, cap - unexplained);
    }
  }
  return model;
}

double CostProfile::SampleVariance(int replica, int layer) const {
  if (replica < 0 || replica >= replicas() || layer < 0 || layer >= num_layers_) return 0;
  const double sd = noise_[static_cast<size_t>(replica)][static_cast<size_t>(layer)].sd();
  return sd * sd;
}

std::vector<double> CostProfile::LayerNoise() const {
  std::vector<double> sd(static_cast<size_t>(num_layers_), 0.0);
  for (const auto& replica : noise_) {
    for (size_t i = 0; i < replica.size(); ++i) {
      sd[i] = std::max(sd[i], SmoothedSd(replica[i].sd(), options_.smoothing));
    }
  }
  return sd;
}

}  // namespace dynmo::core
