// Mixture of Depths with predictor routing (--dynamism=mod
// --mod_routing=predictor), the stage side: the fraction of tokens each MoD
// block runs, job-wide, and "model changed" when it moves (the layer side is
// mixture_of_depths.h).
//
// After every iteration each rank puts its MoD blocks' counters (tokens
// that reached the block, tokens it ran) into the iteration report, whose
// world all-reduce sums them (no collective of its own), so every rank holds
// the same profile. When some block's fraction moved by at least
// --mod_event_delta since the last event (the first compares with "every
// token"), the next iteration is reported as "model changed" and rank 0
// prints the profile: the load the per-layer times already measure, made
// visible. Top-k routing needs none of this:
// its load never moves.
//
// Not thread-safe: the rank's training thread calls the hooks.
#ifndef DYNMO_TRAINER_DYNAMISM_MOD_LOAD_PROFILE_H_
#define DYNMO_TRAINER_DYNAMISM_MOD_LOAD_PROFILE_H_

#include <cstdint>
#include <vector>

#include "trainer/dynamism/dynamism.h"
#include "trainer/dynamism/layer_profile.h"

namespace dynmo::trainer {

class ModLoadProfile : public Dynamism {
 public:
  explicit ModLoadProfile(const TrainerConfig& config);
  const char* name() const override { return "mod"; }
  bool TakeModelChanged() override;
  // Two rows: tokens that reached each layer's router, tokens it ran.
  int ReportSlots() const override { return 2 * num_layers_; }
  void FillReport(StageView& stage, absl::Span<double> slots) override;
  void ReportSummed(int64_t iter, absl::Span<const double> slots, int rank) override;
  // Per pipeline layer: the fraction of tokens it ran at the last event
  // (1 for layers that are not MoD blocks).
  const std::vector<double>& reported() const { return profile_.reported(); }

 private:
  int num_layers_;
  LayerProfile profile_;
};

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_DYNAMISM_MOD_LOAD_PROFILE_H_
