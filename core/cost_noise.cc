#include "core/cost_noise.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/measures.h"

namespace dynmo::core {
namespace {

constexpr int kSampleCap = 1 << 20;

// Variance of the layers of the bottleneck stage of `b`.
double BottleneckVariance(const PipelineModel& model,
                          absl::Span<const double> layer_sd,
                          const Boundaries& b) {
  const std::vector<double> loads = StageLoads(model, b);
  const size_t s = static_cast<size_t>(
      std::max_element(loads.begin(), loads.end()) - loads.begin());
  const double speed = model.stages[s].speed;
  double var = 0;
  for (int l = b[s]; l < b[s + 1]; ++l) {
    const double sd = layer_sd[static_cast<size_t>(l)];
    var += sd * sd;
  }
  return var / (speed * speed);
}

}  // namespace

void NoiseTracker::Reset(double sample) {
  if (!std::isfinite(sample)) return;
  mean_ = sample;
  var_ = 0;
  samples_ = 1;
}

void NoiseTracker::Restart(double sample) {
  Reset(sample);
  restarted_ = true;
}

void NoiseTracker::Add(double sample, double weight) {
  if (!std::isfinite(sample) || !(weight > 0)) return;
  if (samples_ == 0 || weight >= 1) {
    Reset(sample);
    return;
  }
  const double diff = sample - mean_;
  const double step = weight * diff;
  mean_ += step;
  var_ = (1 - weight) * (var_ + diff * step);
  samples_ = std::min(samples_ + 1, kSampleCap);
}

void NoiseTracker::Recenter(double mean) {
  if (!std::isfinite(mean) || samples_ == 0) return;
  mean_ = mean;
  var_ = 0;
}

double StageRelativeNoise(const PipelineModel& model, absl::Span<const double> layer_sd) {
  if (layer_sd.size() != model.layers.size() || model.stages.empty()) return 0;
  double var = 0, total = 0;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    var += layer_sd[l] * layer_sd[l];
    total += model.layers[l].time_s();
  }
  if (!(total > 0) || !std::isfinite(var)) return 0;
  return std::sqrt(var * static_cast<double>(model.stages.size())) / total;
}

void StageCorrelation::Add(double stage_s, double layer_var, int first_layer, int layers,
                           double weight, bool restart) {
  if (!std::isfinite(stage_s) || !std::isfinite(layer_var) || layers < 1) return;
  if (restart || first_layer != first_layer_ || layers != layers_) {
    sum_.Reset(stage_s);
    first_layer_ = first_layer;
    layers_ = layers;
  } else {
    sum_.Add(stage_s, weight);
  }
  layer_var_ = layer_var;
}

double StageCorrelation::inflation() const {
  if (sum_.samples() < kMinSamples || !(layer_var_ > 0)) return 1;
  const double sd = sum_.sd();
  return std::clamp(sd * sd / layer_var_, 1.0, static_cast<double>(layers_));
}

double NoiseTracker::sd() const { return var_ > 0 ? std::sqrt(var_) : 0; }

double SmoothedSd(double sample_sd, double smoothing) {
  if (!(sample_sd > 0) || !(smoothing > 0)) return 0;
  const double w = std::min(smoothing, 1.0);
  return sample_sd * std::sqrt(w / (2 - w));
}

absl::StatusOr<double> ReshapeGainNoise(const PipelineModel& model,
                                        const PipelineModel& candidate_model,
                                        absl::Span<const double> layer_sd,
                                        const Boundaries& current,
                                        const Boundaries& candidate,
                                        double candidate_scale) {
  const int layers = static_cast<int>(model.layers.size());
  if (static_cast<int>(layer_sd.size()) != layers ||
      static_cast<int>(candidate_model.layers.size()) != layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gain noise: ", layer_sd.size(), " layer deviations and ",
        candidate_model.layers.size(), " candidate layers for ", layers, " layers"));
  }
  if (!std::isfinite(candidate_scale) || !(candidate_scale > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gain noise: candidate scale must be finite and > 0, got ",
                     candidate_scale));
  }
  for (const auto& [b, m] :
       {std::pair{&current, &model}, std::pair{&candidate, &candidate_model}}) {
    if (absl::Status s = ValidateBoundaries(*b, layers, static_cast<int>(m->stages.size()));
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("gain noise: ", s.message()));
    }
  }
  return std::sqrt(BottleneckVariance(model, layer_sd, current) +
                   candidate_scale * candidate_scale *
                       BottleneckVariance(candidate_model, layer_sd, candidate));
}

absl::StatusOr<double> GainNoise(const PipelineModel& model,
                                 absl::Span<const double> layer_sd,
                                 const Boundaries& current,
                                 const Boundaries& candidate) {
  return ReshapeGainNoise(model, model, layer_sd, current, candidate, 1.0);
}

}  // namespace dynmo::core
