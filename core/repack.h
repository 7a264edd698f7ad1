// Re-packing: run the pipeline on fewer stages when the work has shrunk, and
// name the stages (GPUs) that can be handed back.
//
// RepackOptimal finds the fewest stages whose exact optimal bottleneck stays
// within (1 + tolerance) of the optimal bottleneck on all stages (on as many
// as there are layers, if fewer; tolerance 0: "without losing throughput") and
// fits every memory cap. Survivors are a
// contiguous window of the current stage order, so the new pipeline is the old
// one with its ends trimmed and neighbours stay neighbours; when the stages
// differ in speed (StageSpec::speed, a rank's measured speed) the survivors
// may also be the fastest stages wherever they sit, so the slowest ranks are
// released first and the stages around a released one become neighbours.
// Among candidates it keeps the smallest bottleneck, then the one that moves
// the fewest bytes. The result carries the
// communicator split the trainer applies: colour 0 and key = new stage index
// for survivors, colour -1 (NCCL_SPLIT_NOCOLOR) for released stages.
//
// RepackFirstFit is the paper's Algorithm 4, kept as a baseline: it merges a
// stage into a later one when their memory fits one GPU. It may break layer
// contiguity, which the result reports.
#ifndef DYNMO_CORE_REPACK_H_
#define DYNMO_CORE_REPACK_H_

#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/boundaries.h"
#include "core/cost_model.h"
#include "core/migration.h"

namespace dynmo::core {

inline constexpr int kReleasedColor = -1;

// How one rank of the pipeline joins the split communicator.
struct CommSplit {
  int stage = 0;  // original stage index (pipeline rank)
  int color = 0;  // 0 = active, kReleasedColor = released
  int key = 0;    // new stage index among the active ones; -1 when released
};

struct RepackOptions {
  double tolerance = 0;
  // The bottleneck the tolerance is relative to. Unset: the optimum on all of
  // `model`'s stages. A caller that has already re-packed passes the optimum
  // on the job's full set of stages, so tolerances never compound (a second
  // re-pack at tolerance t stays within 1 + t of that, not of the first
  // re-pack's bottleneck). Must be finite and > 0 when set.
  std::optional<double> reference_bottleneck;
  // Where the layers are now; default uniform (none when stages > layers).
  std::optional<Boundaries> current;
  // The job's names for `model`'s stages, in pipeline order (a re-packed
  // job's original stage ids); empty = 0..stages-1. The result's stages,
  // split and moves are named by them. Distinct, >= 0, one per stage.
  std::vector<int> stage_ids;
};

struct RepackResult {
  std::vector<int> active_stages;    // stage ids (options.stage_ids), in pipeline order
  std::vector<int> released_stages;  // stage ids
  Boundaries boundaries;             // over active stages (size active + 1)
  std::vector<CommSplit> split;      // one per stage, named by its id
  double bottleneck = 0;             // of the re-packed pipeline
  double reference_bottleneck = 0;   // optimal on all stages
  MigrationPlan migration;           // from `current` to the re-packed layout, by id
};

absl::StatusOr<RepackResult> RepackOptimal(const PipelineModel& model,
                                           const RepackOptions& options);

struct FirstFitResult {
  std::vector<int> layer_owner;  // stage per layer after packing
  std::vector<int> active_stages;
  std::vector<int> released_stages;
  bool contiguous = true;  // false when a merge broke layer order
  MigrationPlan migration;
};

// Algorithm 4 with MAX_MEM = each destination's capacity (unbounded caps
// merge freely) and target_stages as the floor on active stages.
absl::StatusOr<FirstFitResult> RepackFirstFit(const PipelineModel& model,
                                              const Boundaries& current,
                                              int target_stages);

}  // namespace dynmo::core

#endif  // DYNMO_CORE_REPACK_H_
