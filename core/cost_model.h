// The cost model: what a layer costs, what a stage can hold, and how long a
// stage takes for a given contiguous range of layers.
//
// A pipeline stage s holds layers [b[s], b[s+1]) (see boundaries.h). Its time
// for one micro-batch is the sum of its layers' forward + input-gradient +
// weight-gradient time divided by the stage's relative speed, plus the time
// to ship the boundary activation to the next stage when that transfer is not
// overlapped with compute. Everything here is plain data; nothing reads a
// clock, a file or a socket. Thread-compatible (no shared state).
#ifndef DYNMO_CORE_COST_MODEL_H_
#define DYNMO_CORE_COST_MODEL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dynmo::core {

// One transformer layer (or the embedding / head, which are layers too).
// Times are seconds per micro-batch on a stage of speed 1.
struct LayerCost {
  int id = 0;
  double fwd_s = 0;     // forward
  double bwd_s = 0;     // input gradient (ZB's "B")
  double wgrad_s = 0;   // weight gradient (ZB's "W")
  int64_t params = 0;
  int64_t resident_bytes = 0;    // weights + grads + optimizer state
  int64_t activation_bytes = 0;  // stashed activations per micro-batch

  double time_s() const { return fwd_s + bwd_s + wgrad_s; }
};

// One pipeline stage (worker). capacity_bytes < 0 means "unbounded".
struct StageSpec {
  int64_t capacity_bytes = -1;
  double speed = 1.0;  // relative throughput; 0.5 = a straggler at half speed
  // Seconds per micro-batch at speed 1 the stage spends sending and
  // receiving its point-to-point exchanges (the host work of the copies and
  // the transport, not waiting): on the stage's own device, so divided by
  // its speed like its layers. 0 = free (no measurement).
  double exchange_s = 0;
  // Micro-batches whose activations this stage holds at its peak (1F1B: p-s).
  // Counts activation_bytes into the memory cap; 0 = caps cover resident only.
  int inflight_microbatches = 0;
};

// The point-to-point link between neighbouring stages. Transformer blocks all
// emit a [micro_batch, seq, hidden] tensor, so one volume per boundary is
// exact for them; it also keeps a stage's cost monotone in its layer range,
// which is what makes the exact partitioner exact.
struct LinkSpec {
  int64_t boundary_bytes = 0;
  double bandwidth_bytes_per_s = 0;  // 0 = free link
  bool overlapped = true;            // true: transfer hidden behind compute

  // Seconds a non-last stage adds per micro-batch for its outgoing transfer.
  double exposed_transfer_s() const {
    if (overlapped || bandwidth_bytes_per_s <= 0) return 0;
    return static_cast<double>(boundary_bytes) / bandwidth_bytes_per_s;
  }
};

// Everything a partitioner needs to know about one pipeline.
struct PipelineModel {
  std::vector<LayerCost> layers;
  std::vector<StageSpec> stages;
  LinkSpec link;
};

// A time, size or rate as the cost model accepts it: finite and >= 0 (NaN
// and infinities are not). Shared by everything that validates costs.
bool FiniteNonNegative(double v);

// Returns OK when every number is finite and non-negative, speeds are
// positive, there is at least one stage and one layer, and ids are 0..n-1 in
// order. The message names the offending layer or stage.
absl::Status ValidateModel(const PipelineModel& model);

// Profiles of the same layer from several data-parallel replicas combine into
// one cost per layer by taking, per field, the maximum over replicas: a
// pipeline step ends when the slowest replica's stage ends (the gradient
// all-reduce waits for it), so the max is what the pipeline actually pays.
// All replicas must report the same number of layers.
absl::StatusOr<std::vector<LayerCost>> CombineReplicaProfiles(
    absl::Span<const std::vector<LayerCost>> replicas);

// Prefix sums over a layer sequence, so any contiguous range costs O(1).
// The exact partitioner, the brute force and the measures all price a range
// through this one class, so they agree bit for bit.
class LayerPrefix {
 public:
  LayerPrefix() = default;
  explicit LayerPrefix(absl::Span<const LayerCost> layers);

  int size() const { return static_cast<int>(time_.size()) - 1; }
  // Seconds of compute (F+B+W at speed 1) of layers [i, j).
  double time(int i, int j) const { return time_[j] - time_[i]; }
  double fwd(int i, int j) const { return fwd_[j] - fwd_[i]; }
  double bwd(int i, int j) const { return bwd_[j] - bwd_[i]; }
  double wgrad(int i, int j) const { return wgrad_[j] - wgrad_[i]; }
  int64_t params(int i, int j) const { return params_[j] - params_[i]; }
  int64_t resident(int i, int j) const { return resident_[j] - resident_[i]; }
  int64_t activation(int i, int j) const { return act_[j] - act_[i]; }

 private:
  std::vector<double> time_, fwd_, bwd_, wgrad_;
  std::vector<int64_t> params_, resident_, act_;
};

// Seconds stage `s` of `num_stages` takes per micro-batch for layers [i, j).
double StageTime(const LayerPrefix& prefix, const StageSpec& stage,
                 const LinkSpec& link, int s, int num_stages, int i, int j);

// Bytes stage `stage` needs at its peak for layers [i, j).
int64_t StageMemory(const LayerPrefix& prefix, const StageSpec& stage, int i,
                    int j);

// True when layers [i, j) fit under the stage's capacity.
bool FitsMemory(const LayerPrefix& prefix, const StageSpec& stage, int i,
                int j);

}  // namespace dynmo::core

#endif  // DYNMO_CORE_COST_MODEL_H_
