// CostProfile: what has been measured of one job's layers, and the
// PipelineModel a decision is made on.
//
// Every data-parallel replica runs the same layers, and each rank reports
// the per-layer costs of its own stage. CostProfile keeps one smoothed cost
// per (replica, layer): the first sample of a (replica, layer), or one taken
// right after the model changed, replaces the estimate; the job's second
// one replaces it with the smaller of the two (a time is slowed by
// interference, never sped up: a one-off stall in the first two samples, a
// warm-up hiccup, must not decide the first plan); later ones are smoothed
// in (an EWMA of weight `smoothing`, so that bursty costs count at their
// mean). Beside each cost it tracks the spread of the layer's time samples
// (cost_noise.h), from the job's third sample on: the first two only set
// where it starts (a warm-up hiccup must not hold the first plan either).
// Once every (replica, layer) has been seen, Model() combines the replicas
// (CombineReplicaProfiles: max per field, the slowest replica paces the
// step) and sizes each stage
// from what its ranks reported: the memory cap, the micro-batches whose
// activations it holds, and the measured memory its layers do not explain,
// which comes off the cap.
//
// Pure and deterministic; thread-compatible (the coordinator's job lock
// guards it).
#ifndef DYNMO_CORE_COST_PROFILE_H_
#define DYNMO_CORE_COST_PROFILE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/boundaries.h"
#include "core/cost_model.h"
#include "core/cost_noise.h"
#include "core/pipeline_sim.h"

namespace dynmo::core {

struct CostProfileOptions {
  double smoothing = 0.5;  // EWMA weight of a new cost sample, (0, 1]
  // EWMA weight of a new sample in each layer's noise estimate: slower than
  // `smoothing`, so the spread is taken over ~20 samples, not the ~3 the
  // cost follows.
  double noise_smoothing = 0.1;
};

// What the ranks of one active stage reported about its memory.
struct StageMemoryReport {
  int64_t capacity_bytes = -1;  // the smallest of its ranks'; < 0 = unknown
  int64_t used_bytes = 0;       // the newest measured peak, largest of its ranks'
};

// What the pipeline runs, beside its layers' costs.
struct PipelineShape {
  std::vector<StageMemoryReport> stages;  // one per active stage, in order
  Boundaries boundaries;                  // the layout in force
  Schedule schedule = Schedule::k1F1B;
  int microbatches = 1;
};

class CostProfile {
 public:
  // `replicas` and `num_layers` >= 1.
  CostProfile(int replicas, int num_layers, const CostProfileOptions& options);

  // Folds one measured sample of layer `sample.id` on `replica` in. With
  // `model_changed` the sample replaces the estimate and restarts the
  // layer's noise (the old spread says nothing about the new layer).
  // Errors: INVALID_ARGUMENT for a replica or layer out of range (nothing
  // changes).
  absl::Status Add(int replica, const LayerCost& sample, bool model_changed);

  int replicas() const { return static_cast<int>(costs_.size()); }
  int num_layers() const { return num_layers_; }
  // (replica, layer) pairs never reported yet.
  int missing() const { return missing_; }

  // The model to decide on: the replicas combined, one StageSpec per entry
  // of `shape.stages`. The activations of min(microbatches, stages)
  // micro-batches (1F1B's first stage; all of them for GPipe) count into
  // every stage, so re-packing sees identical stages. When the boundaries
  // fit, what a stage measured beyond what its layers explain (allocator
  // slack, workspaces, buffers) comes off its cap: it is the stage's, not
  // the layers' to carry along. Errors: FAILED_PRECONDITION while samples
  // are missing.
  absl::StatusOr<PipelineModel> Model(const PipelineShape& shape) const;

  // The standard error of each layer's smoothed time, the max over replicas
  // (what GainNoise takes).
  std::vector<double> LayerNoise() const;
  // The variance of layer `layer`'s time samples on `replica` (not of its
  // smoothed cost); 0 out of range.
  double SampleVariance(int replica, int layer) const;

 private:
  CostProfileOptions options_;
  int num_layers_;
  // [replica][layer]
  std::vector<std::vector<LayerCost>> costs_;
  std::vector<std::vector<bool>> seen_;
  std::vector<std::vector<NoiseTracker>> noise_;
  int missing_;
};

}  // namespace dynmo::core

#endif  // DYNMO_CORE_COST_PROFILE_H_
