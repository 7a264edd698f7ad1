// Early exit, the stage side: detects that the exit profile moved, so the
// coordinator rebalances (the layer side is early_exit.h).
//
// After every iteration each rank puts its exit points' counters (tokens
// that left at each point) into the iteration report, whose world
// all-reduce sums them (every rank takes part: no collective of its own),
// so every rank holds the same job-wide profile: the fraction of tokens
// still in flight after each exit point. When some point's fraction moved
// by at least --exit_event_delta since the last event (the first event
// compares with "every token in flight"), the next iteration is reported as
// "model changed": its measured costs are those of the new profile, which
// is what the on-event trigger decides on. Rank 0 prints the profile at
// each event, naming the iteration whose counts moved it.
//
// Not thread-safe: the rank's training thread calls the hooks.
#ifndef DYNMO_TRAINER_DYNAMISM_EARLY_EXIT_PROFILE_H_
#define DYNMO_TRAINER_DYNAMISM_EARLY_EXIT_PROFILE_H_

#include <cstdint>
#include <vector>

#include "trainer/dynamism/dynamism.h"
#include "trainer/dynamism/layer_profile.h"

namespace dynmo::trainer {

class EarlyExitProfile : public Dynamism {
 public:
  explicit EarlyExitProfile(const TrainerConfig& config);
  const char* name() const override { return "early-exit"; }
  bool TakeModelChanged() override;
  int ReportSlots() const override { return num_layers_; }
  void FillReport(StageView& stage, absl::Span<double> slots) override;
  void ReportSummed(int64_t iter, absl::Span<const double> slots, int rank) override;
  // Per pipeline layer: the fraction of tokens in flight after it at the
  // last event (1 for layers without an exit point).
  const std::vector<double>& reported() const { return profile_.reported(); }

 private:
  int num_layers_;
  double tokens_per_iteration_;  // job-wide: dp · M · B · T
  LayerProfile profile_;
};

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_DYNAMISM_EARLY_EXIT_PROFILE_H_
