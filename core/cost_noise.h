// Timing noise of measured layer costs, and how much of a predicted gain it
// could explain.
//
// A rank's per-layer time samples scatter around the layer's true cost
// (scheduler jitter, caches, a neighbour's load). The coordinator decides on
// smoothed costs, so two layouts whose true bottlenecks are equal still look
// different by a random amount; deciding on that difference moves layers
// back and forth (A -> B -> A). NoiseTracker estimates one layer's sample
// standard deviation with an exponentially weighted mean and variance;
// GainNoise turns the layers' standard errors into the standard deviation of
// a predicted bottleneck gain, which a trigger compares the gain against.
// StageCorrelation measures how far that independence is from the truth on
// one rank: a shared core or a throttle slows all of a rank's layers at
// once, so its stage's time scatters more than its layers' spreads added
// as independent.
//
// Pure and deterministic; thread-compatible (plain values, no shared state).
#ifndef DYNMO_CORE_COST_NOISE_H_
#define DYNMO_CORE_COST_NOISE_H_

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/boundaries.h"
#include "core/cost_model.h"

namespace dynmo::core {

// The spread of one layer's time samples. Add(x, w) is the exponentially
// weighted update (West 1979 / Finch 2009): after a Reset the variance
// starts at 0 and grows as samples disagree; `weight` in (0, 1] is the share
// of the newest sample (0.1 ~ the last 19 samples). Non-finite samples are
// ignored (validation refuses them before they get here).
class NoiseTracker {
 public:
  void Reset(double sample);
  // Reset for a changed layer; restarted() says one happened.
  void Restart(double sample);
  void Add(double sample, double weight);
  // The samples so far say nothing of the spread (a job's warm-up pair: its
  // first iterations run slower, once): it starts again at 0 around `mean`,
  // their count kept. A non-finite `mean` is ignored.
  void Recenter(double mean);
  double sd() const;          // sample standard deviation, >= 0
  int samples() const { return samples_; }  // since the last Reset, capped
  bool restarted() const { return restarted_; }

 private:
  double mean_ = 0;
  double var_ = 0;
  int samples_ = 0;
  bool restarted_ = false;  // in the padding: the tracker stays 24 bytes
};

// How much more one rank's stage time scatters than its layers' spreads
// added as if independent: var(Σ t_l) / Σ var(t_l), both exponentially
// weighted alike. 1 for independent layer noise; up to the stage's layer
// count when every layer of the rank is slowed together (a neighbour on a
// shared core, bursts of a throttle). A job multiplies its layers'
// deviations by sqrt(inflation()) before GainNoise, so a correlated rank's
// bursts are priced as the stage-wide swings they are.
class StageCorrelation {
 public:
  // Samples of the stage's sum before inflation() says anything.
  static constexpr int kMinSamples = 10;
  // One report of the rank: its layers [first_layer, first_layer + layers)
  // took `stage_s` in all, and their sample variances sum to `layer_var`.
  // A different layer range, or `restart` (the rank's speed moved, the
  // model changed), starts the stage's spread again.
  void Add(double stage_s, double layer_var, int first_layer, int layers, double weight,
           bool restart);
  // In [1, layers]; 1 until kMinSamples reports or while the layers show no
  // spread.
  double inflation() const;

 private:
  NoiseTracker sum_;
  double layer_var_ = 0;
  int first_layer_ = -1;
  int layers_ = 0;
};

// The standard deviation of an EWMA mean with new-sample weight `smoothing`
// of samples with standard deviation `sample_sd`: sd · sqrt(w / (2 − w)).
double SmoothedSd(double sample_sd, double smoothing);

// Standard deviation of (bottleneck under `current`) − (bottleneck under
// `candidate`), given each layer's cost standard error `layer_sd` (per
// micro-batch, like the model's times): each layout's bottleneck stage sums
// its layers' variances (divided by speed²); the two are added as if
// independent, which over-states the spread when the stages share layers
// (positively correlated), so the estimate errs on the side of "noise".
// Both layouts are over the model's stages. Errors: sizes that do not match.
absl::StatusOr<double> GainNoise(const PipelineModel& model,
                                 absl::Span<const double> layer_sd,
                                 const Boundaries& current,
                                 const Boundaries& candidate);

// The same for a re-shape to another grid: `candidate` is over
// `candidate_model`'s stages (the same layers, another stage count), and its
// bottleneck's spread counts `candidate_scale` times (a grid of dp'
// replicas instead of dp runs dp / dp' as many micro-batches per replica, so
// its time per original micro-batch is its bottleneck's times dp / dp').
// Errors: sizes that do not match, a scale not finite and > 0.
absl::StatusOr<double> ReshapeGainNoise(const PipelineModel& model,
                                        const PipelineModel& candidate_model,
                                        absl::Span<const double> layer_sd,
                                        const Boundaries& current,
                                        const Boundaries& candidate,
                                        double candidate_scale);

// The relative standard deviation of one stage's time when the model's
// layers are spread evenly over its stages: sqrt(stages) · sqrt(Σ sd²) /
// Σ time (each stage holds 1/stages of the time and of the variance).
// Bottlenecks closer than a few of these are indistinguishable in measured
// costs. 0 when the sizes differ or the model has no time.
double StageRelativeNoise(const PipelineModel& model, absl::Span<const double> layer_sd);

}  // namespace dynmo::core

#endif  // DYNMO_CORE_COST_NOISE_H_
