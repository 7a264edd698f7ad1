// Re-shaping: the same job on the same ranks as a different grid, pp' stages
// x dp' data-parallel replicas, and what each grid costs per iteration.
//
// A job on R ranks trains a fixed global batch of G micro-batches per
// iteration. As pp' x dp' (pp' * dp' = R), each replica runs G / dp' of them
// through a pp'-stage pipeline on the optimal contiguous partition for pp'
// stages (memory caps with 1F1B's in-flight activations honoured), and then
// every stage all-reduces its gradients over its dp' replicas: a ring moves
// 2 (dp' - 1) / dp' x the stage's gradient bytes per rank at the all-reduce
// bandwidth, of which the fraction `overlap` hides behind the backward pass.
//   iteration_s = pipeline_s (SimulatePipeline of the schedule)
//               + (1 - overlap) x the slowest stage's all-reduce
//   tokens_per_s = G x tokens_per_microbatch / iteration_s
// A shorter pipeline has fewer bubbles ((pp'-1) of m'+pp'-1 slots) and more
// replicas share the batch, so when the work has shrunk enough to fit fewer
// stages, the ranks re-packing would free run more replicas instead.
//
// Changing the grid costs once: each rank receives the resident state
// (weights, gradients, optimizer state) of the layers of its new stage that
// it does not hold yet, by the rule of plan.proto's Reshape (a rank keeps its
// position p; stage p / dp', replica p % dp'). Ranks receive in parallel, so
// the pause is the busiest receiver's bytes over the copy bandwidth.
//
// Pure and deterministic; thread-compatible.
#ifndef DYNMO_CORE_RESHAPE_H_
#define DYNMO_CORE_RESHAPE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/boundaries.h"
#include "core/cost_model.h"
#include "core/stage_program.h"

namespace dynmo::core {

// The data-parallel side of the cost model.
struct DataParallelSpec {
  // Per-rank bus bandwidth of the gradient all-reduce; 0 = free.
  double allreduce_bandwidth_bytes_per_s = 0;
  // Fraction of the all-reduce hidden behind the backward pass, in [0, 1].
  double overlap = 0;
  // Bytes of gradient per parameter the all-reduce moves (fp32: 4).
  int64_t grad_bytes_per_param = 4;
  // Bandwidth a rank receives copied layers at when the grid changes;
  // 0 = copies are free.
  double copy_bandwidth_bytes_per_s = 0;
};

// A job's ranks as a grid: `pp` stages of `dp` replicas on `boundaries`
// (size pp + 1, over the job's layers).
struct Grid {
  int pp = 1;
  int dp = 1;
  Boundaries boundaries;
};

struct ShapeSpec {
  int global_microbatches = 1;  // G, per iteration over all replicas
  double tokens_per_microbatch = 1;
  Schedule schedule = Schedule::k1F1B;
  // Every rank's device (capacity, speed); inflight_microbatches is set per
  // stage from the schedule and is ignored here.
  StageSpec device;
  // Each rank's measured speed by position p = stage * dp + replica (a rank
  // keeps its position in every grid, plan.proto's Reshape rule), so a grid
  // is priced on the devices it would run on: a stage runs at its slowest
  // replica's speed. Empty: every rank at device.speed. Otherwise one per
  // rank of the grid, each finite and > 0.
  std::vector<double> rank_speeds;
  LinkSpec link;
  DataParallelSpec data_parallel;
};

struct ShapeCost {
  int pp = 1;
  int dp = 1;
  Boundaries boundaries;     // optimal for pp stages
  double pipeline_s = 0;     // one iteration's pipeline, per replica
  double allreduce_s = 0;    // exposed all-reduce of the slowest stage
  double iteration_s = 0;    // pipeline_s + allreduce_s
  double tokens_per_s = 0;
  int64_t copy_bytes = 0;    // sent in all, to reach this grid from `from`
  double copy_s = 0;         // the busiest receiver's bytes / copy bandwidth
};

// Returns OK when G >= 1, tokens_per_microbatch > 0 and finite, the device
// speed > 0, every bandwidth finite and >= 0, overlap in [0, 1] and
// grad_bytes_per_param >= 0.
absl::Status ValidateShapeSpec(const ShapeSpec& spec);

// What `layers` cost as `pp` x `dp` from the grid `from` (pp * dp must equal
// from.pp * from.dp), on the optimal partition for pp stages (ties toward
// from's boundaries when pp == from.pp; and from's own boundaries when they
// fit and the simulator finds them at least as fast, since the least
// bottleneck is not always the fastest iteration). Errors: invalid input, G not divisible by dp, more
// stages than layers, or memory caps no partition on pp stages fits.
absl::StatusOr<ShapeCost> CostOfShape(absl::Span<const LayerCost> layers,
                                      const ShapeSpec& spec, const Grid& from,
                                      int pp, int dp);

// The same, keeping `grid` exactly as it is (its own boundaries, no copy):
// the baseline a re-shape is weighed against.
absl::StatusOr<ShapeCost> CostOfGrid(absl::Span<const LayerCost> layers,
                                     const ShapeSpec& spec, const Grid& grid);

// Every grid of from.pp * from.dp ranks that is feasible (dp divides G,
// pp <= layers, memory fits), fastest first (ties: fewer copied bytes, then
// larger pp). Errors: invalid input, or no grid is feasible.
absl::StatusOr<std::vector<ShapeCost>> FeasibleShapes(
    absl::Span<const LayerCost> layers, const ShapeSpec& spec, const Grid& from);

// Bytes each position 0..pp*dp-1 receives to go from `from` to `to` (same
// number of ranks, boundaries over the same layers), by the Reshape rule.
std::vector<int64_t> ReshapeReceiveBytes(absl::Span<const LayerCost> layers,
                                         const Grid& from, const Grid& to);

}  // namespace dynmo::core

#endif  // DYNMO_CORE_RESHAPE_H_
