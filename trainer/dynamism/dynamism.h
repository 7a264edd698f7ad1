// Dynamism: the stage-level side of a dynamic-model scheme (pruning steps,
// freezing decisions, ...): what it does to one rank's layers at iteration
// boundaries. The layer-level side (what a block computes per micro-batch:
// MoE routing, sparse attention, early exit, MoD, CSR weights) lives in the
// layers themselves (trainer/model/), built from ModelConfig::dynamism.
//
// Every rank of the job calls the hooks at the same points in the same
// order, so a hook may use the transport's collectives (e.g. a global
// top-k over all stages). Hooks run on the rank's training thread.
#ifndef DYNMO_TRAINER_DYNAMISM_DYNAMISM_H_
#define DYNMO_TRAINER_DYNAMISM_DYNAMISM_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "trainer/comm/transport.h"
#include "trainer/config/config.h"
#include "trainer/state/layer_state.h"  // OwnedLayer

namespace dynmo::trainer {

// One rank's view of its stage, as the hooks see it.
struct StageView {
  const TrainerConfig& config;
  int stage = 0;
  int num_stages = 1;
  int dp_rank = 0;
  std::vector<OwnedLayer>& layers;  // this stage's layers, in id order
  Transport& transport;
  // Job-wide (layer freezing, freezing.h): pipeline layers [0, P) are
  // frozen — no backward, no optimizer step, no dp gradient exchange, and
  // no gradient across a stage boundary at or below P. A hook sets it in
  // BeforeIteration; every rank holds the same P. Null: no freezing.
  int* frozen_prefix = nullptr;
};

class Dynamism {
 public:
  virtual ~Dynamism() = default;
  virtual const char* name() const = 0;
  // At the boundary before iteration `iter`'s schedule, after any migration,
  // before gradients are zeroed.
  virtual absl::Status BeforeIteration(int64_t iter, StageView& stage) {
    return absl::OkStatus();
  }
  // After iteration `iter`'s optimizer step.
  virtual absl::Status AfterStep(int64_t iter, StageView& stage) {
    return absl::OkStatus();
  }
  // True (once) when a hook changed the model's per-layer cost since the
  // last call: reported to the coordinator as "model changed", which is what
  // the on-event trigger rebalances on.
  virtual bool TakeModelChanged() { return false; }

  // Job-wide counters that ride in the iteration report's one world
  // all-reduce (trainer/run/iteration_report.h) instead of a collective of
  // their own: the hook asks for ReportSlots() doubles (the same number on
  // every rank), FillReport writes this rank's counts after the step, and
  // ReportSummed hands back their sums over every rank of the job, on every
  // rank, before the next iteration starts. A change it finds there is
  // taken by the next iteration's report: one iteration late, no extra wait.
  virtual int ReportSlots() const { return 0; }
  virtual void FillReport(StageView& stage, absl::Span<double> slots) {}
  virtual void ReportSummed(int64_t iter, absl::Span<const double> slots, int rank) {}
};

// The stage-level schemes `config.model.dynamism` names (those that have
// one), in a fixed order, so every rank runs the same hooks.
std::vector<std::unique_ptr<Dynamism>> MakeStageDynamisms(const TrainerConfig& config);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_DYNAMISM_DYNAMISM_H_
