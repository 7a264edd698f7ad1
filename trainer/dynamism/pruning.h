// GradualPruning (--dynamism=pruning): the stage-level side of gradual
// global magnitude pruning, the paper's §2.2 case and Algorithm 2.
//
// After the optimizer step of every pruning iteration t of the schedule
// (pruning_schedule.h) — run as the BeforeIteration hook of iteration t + 1,
// after any migration — every rank takes part in one global pruning step:
//   1. the job-wide number of prunable weights D (one all-reduce), so the
//      step keeps keep = round(D · (1 − S_t)) weights of the whole model;
//   2. the global threshold over the stored weights of all stages
//      (global_magnitude_threshold.h: radix select + variable-sized
//      all-gather of the candidates; no rank sees the model);
//   3. every rank prunes its own PrunableLinear layers below it
//      (prunable_linear.h), moving them to the masked or CSR form and
//      editing their AdamW state.
// Only dp replica 0 of each stage contributes magnitudes (its replicas hold
// bit-identical copies), every replica applies the same threshold.
//
// What is pruned: the four weight matrices of every decoder block (qkv,
// attention_out, mlp_in, mlp_out) — the GEMMs that are the block's work.
// Not pruned: embeddings, LayerNorms, biases and the LM head (the paper's
// and Zhu & Gupta's choice: they are small, or, for the tied-size
// embedding/head, their sparsity saves no compute in a lookup and hurts
// accuracy most). Global magnitude pruning then leaves blocks at different
// sparsities, which is the load imbalance DynMo rebalances: a step that
// removed weights reports "model changed" (the coordinator's on-event
// trigger) with iteration t + 1, the first one measured on the pruned model
// (the paper's profiling iteration, Algorithm 1 lines 13-18): the report
// that carries the flag carries the new per-layer times.
// Runs on the rank's training thread; not thread-safe.
#ifndef DYNMO_TRAINER_DYNAMISM_PRUNING_H_
#define DYNMO_TRAINER_DYNAMISM_PRUNING_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/dynamism/dynamism.h"
#include "trainer/dynamism/pruning_schedule.h"
#include "trainer/model/prunable_linear.h"

namespace dynmo::trainer {

struct GlobalPruneResult {
  double target_sparsity = 0;
  // The timed form choices of this rank's matrices (prunable_linear.h):
  // how many took each form, and the summed timings they were decided on
  // (seconds, the dp group's sums; a form not timed here adds nothing).
  int timed_masked = 0;
  int timed_csr = 0;        // our kernels
  int timed_torch_csr = 0;  // LibTorch's sparse CSR (cuSPARSE on a GPU)
  double timed_masked_s = 0;
  double timed_csr_s = 0;
  double timed_torch_csr_s = 0;
  int64_t prunable = 0;  // D: prunable weights of the whole model
  int64_t keep = 0;      // weights the step keeps job wide (plus ties)
  float threshold = 0;
  int64_t pruned_here = 0;  // weights this rank removed
  bool changed = false;     // some rank removed weights (same on all ranks)
};

// The prunable linear layers of one pipeline layer, in module order.
std::vector<PrunableLinear> PrunableLinears(PipelineLayer& layer);

// One global pruning step of the stage's layers to `sparsity` of the whole
// model, each matrix in the form `config` picks (timed: agreed over the dp
// replicas of the stage). A collective: every rank of the job calls it with
// the same values.
absl::StatusOr<GlobalPruneResult> PruneGlobally(StageView& stage, double sparsity,
                                                const PruningConfig& config);

class GradualPruning : public Dynamism {
 public:
  explicit GradualPruning(const PruningConfig& config) : config_(config) {}
  const char* name() const override { return "pruning"; }
  absl::Status BeforeIteration(int64_t iter, StageView& stage) override;
  bool TakeModelChanged() override;

 private:
  PruningConfig config_;
  bool changed_ = false;
};

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_DYNAMISM_PRUNING_H_
