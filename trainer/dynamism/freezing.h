// Layer freezing (Egeria, Wang et al. 2022; AutoFreeze), the stage side.
//
// Plasticity. At every check (after the optimizer step of iterations
// every-1, 2·every-1, ...) each not-yet-frozen layer's owner measures how
// far the layer's parameters moved since the previous check, relative to
// their size: r = ‖θ_now − θ_ref‖₂ / ‖θ_ref‖₂, and keeps θ_now as the next
// reference (one flat copy per layer, Egeria's "reference model" kept in
// parameter space). The plasticity is r divided by the layer's first
// measured r, so it is scale-free (1 at the start, → 0 as AdamW's updates
// turn into noise that averages out in its first moment). A layer whose
// plasticity was below --freeze_threshold at --freeze_window consecutive
// checks is *converged*.
//
// Freezing is strictly front to back and job-wide: the measurements are
// all-reduced over the world at the check (every rank takes part), every
// rank runs the same FreezeSchedule on the same numbers, so all agree on
// one frozen prefix P: pipeline layers [0, P) are frozen, P grows only
// while layer P is converged, never past --freeze_max_layers or the head.
// Frozen-ness is derived from P and the layer id, never stored in a layer,
// so a layer that migrates stays frozen. A layer that just arrived has no
// reference yet: it gives no measurement at its first check (its streak is
// kept, not reset).
//
// What freezing changes (BeforeIteration applies it; PipelineStage obeys
// StageView::frozen_prefix): a frozen layer's parameters stop requiring
// gradients and lose their .grad, so AdamW skips them and they leave the dp
// gradient all-reduce; the stage runs no backward for them, layer P's input
// needs no gradient, and no gradient crosses a stage boundary at or below
// P (both neighbours derive that from P and the boundary, so the 1F1B
// point-to-point pattern stays matched). Forward still runs.
//
// The first iteration run with a new P is reported as "model changed" to the
// coordinator (TakeModelChanged after it), so the on-event trigger decides
// on costs measured under the new frozen prefix.
//
// Not thread-safe: the rank's training thread calls the hooks.
#ifndef DYNMO_TRAINER_DYNAMISM_FREEZING_H_
#define DYNMO_TRAINER_DYNAMISM_FREEZING_H_

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <vector>

#include "trainer/config/freezing_exit_config.h"
#include "trainer/dynamism/dynamism.h"

namespace dynmo::trainer {

// The job-wide decision, pure: same inputs on every rank, same prefix.
class FreezeSchedule {
 public:
  FreezeSchedule(const FreezingConfig& config, int num_layers);
  // One check's relative changes per pipeline layer; `known[l]` false: no
  // measurement for l this time. Returns the frozen prefix after it.
  int Observe(const std::vector<double>& change, const std::vector<bool>& known);
  int frozen_prefix() const { return prefix_; }
  // The most layers that may freeze (the head never does).
  int limit() const { return limit_; }
  // Layer l's plasticity at the last check it was measured (NaN: never).
  double plasticity(int l) const { return plasticity_[l]; }

 private:
  FreezingConfig config_;
  int limit_;
  int prefix_ = 0;
  std::vector<double> first_change_;  // 0: not measured yet
  std::vector<double> plasticity_;
  std::vector<int> streak_;  // consecutive checks below the threshold
};

class Freezing : public Dynamism {
 public:
  explicit Freezing(const TrainerConfig& config);
  const char* name() const override { return "freezing"; }
  absl::Status BeforeIteration(int64_t iter, StageView& stage) override;
  absl::Status AfterStep(int64_t iter, StageView& stage) override;
  bool TakeModelChanged() override;
  int frozen_prefix() const { return schedule_.frozen_prefix(); }

 private:
  absl::Status Check(int64_t iter, StageView& stage);

  int every_;
  int num_layers_;
  FreezeSchedule schedule_;
  std::map<int, torch::Tensor> reference_;  // layer id -> flat parameters
  bool pending_ = false;  // P grew; the next iteration runs under it
  bool changed_ = false;  // that iteration ran: report it
};

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_DYNAMISM_FREEZING_H_
