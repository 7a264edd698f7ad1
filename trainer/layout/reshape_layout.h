// Re-shaping arithmetic of dynmo-train: how a pp x dp job is re-grouped into
// a pp' x dp' grid on the SAME ranks (plan.proto's `Reshape`), as plain
// structs. Pure (no LibTorch, no I/O), so it is unit-tested on its own.
//
// The running ranks are numbered by position, p = active index * dp +
// replica (config.h's layout over the running stages, which is also the
// rank on the running transport). After the step rank p is stage p / dp',
// replica p % dp' of pp' stages with ids 0..pp'-1 (the pipeline is
// renumbered; nothing is released), holding layers [b'[s], b'[s+1]).
// A layer p held before it keeps; one it lacks is COPIED (weights, AdamW
// state, the layer's own dynamic state) from the rank that held it in
// replica (p % dp') mod dp of the layer's old stage, so the replicas of
// every new stage end identical. Copies are grouped into rounds in which a
// rank sends or receives at most one layer; every rank walks the list in
// order, so blocking sends and receives cannot deadlock (the earliest
// pending copy always has both of its ranks waiting on it — the argument
// of core/migration.h). Senders keep every old layer until the last copy.
//
// The global batch stays the user's: each replica runs
// dp * microbatches / dp' micro-batches afterwards (a shape that does not
// divide it is refused), and the data-parallel mean keeps the same mean
// over the global batch.
#ifndef DYNMO_TRAINER_LAYOUT_RESHAPE_LAYOUT_H_
#define DYNMO_TRAINER_LAYOUT_RESHAPE_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/boundaries.h"
#include "core/reshape.h"
#include "trainer/layout/repack_layout.h"

namespace dynmo::trainer {

// The grid a reshape asks for: pp' x dp' with boundaries over the pp' new
// stages (the decision core's grid); empty boundaries here mean uniform.
using ReshapeTarget = core::Grid;

// One layer sent from one running rank to another (ranks = positions p).
struct LayerCopy {
  int layer = 0;
  int from_rank = 0;
  int to_rank = 0;
  int round = 0;
};

struct ReshapeStep {
  StageLayout from;  // running stages (original ids) and boundaries
  int from_dp = 1;
  int from_microbatches = 1;  // per replica
  StageLayout to;             // stages 0..pp'-1 and their boundaries
  int to_dp = 1;
  int to_microbatches = 1;    // per replica: from_dp * from_microbatches / to_dp
  // Per rank p: its place in the new grid, stage p / to_dp and replica
  // p % to_dp (config.h's layout).
  std::vector<int> stage_after;
  std::vector<int> replica_after;
  // Per rank p: the layers it holds after, [first, last).
  std::vector<int> first_layer_after;
  std::vector<int> last_layer_after;
  // Sorted by (round, layer, to_rank); every rank appears at most once per
  // round.
  std::vector<LayerCopy> copies;
  int rounds = 0;

  int ranks() const { return static_cast<int>(stage_after.size()); }
  int to_pp() const { return static_cast<int>(to.active_stages.size()); }
};

// Validates `target` against the running layout (pp' * dp' = the running
// ranks, boundaries partitioning `num_layers` over pp' with no empty stage,
// dp' dividing the global micro-batches) and derives the step. Errors
// (INVALID_ARGUMENT) say what does not fit.
absl::StatusOr<ReshapeStep> PlanReshapeStep(const StageLayout& from, int dp,
                                            int microbatches,
                                            const ReshapeTarget& target,
                                            int num_layers);

// Which running rank holds layer `layer` for replica `replica` of the old
// layout (the rank a rank of new replica r copies it from, with replica =
// r mod dp).
int HolderBefore(const StageLayout& from, int dp, int layer, int replica);

// The test policy's "ITER:PPxDP[:b0,b1,...]" (--test_reshape_at).
struct ReshapeAt {
  int64_t iteration = 0;
  ReshapeTarget target;
};
absl::StatusOr<ReshapeAt> ParseReshapeAt(absl::string_view text);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_LAYOUT_RESHAPE_LAYOUT_H_
