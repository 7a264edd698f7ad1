// LayerProfile: a per-pipeline-layer fraction that a stage-level scheme
// watches job-wide (tokens still in flight after each exit point; tokens
// each Mixture-of-Depths block runs), and the "model changed" events it
// raises when that fraction moves: an event when some layer's value moved
// by at least `event_delta` since the last event (the first compares with
// the initial values). The iteration that raised it already measured the
// new costs, which is what the on-event trigger rebalances on.
//
// Plain values, no collectives: the scheme sums its counts over the world
// first, so every rank updates its profile with the same values.
// Thread-compatible.
#ifndef DYNMO_TRAINER_DYNAMISM_LAYER_PROFILE_H_
#define DYNMO_TRAINER_DYNAMISM_LAYER_PROFILE_H_

#include <string>
#include <vector>

namespace dynmo::trainer {

class LayerProfile {
 public:
  // `initial`: one value per pipeline layer, what the first event compares with.
  LayerProfile(std::vector<double> initial, double event_delta);
  // Records this iteration's values; true when that is an event (then they
  // become the reported values and TakeChanged turns true once).
  bool Update(const std::vector<double>& values);
  // The values at the last event (the initial ones before any).
  const std::vector<double>& reported() const { return reported_; }
  // True (once) after an event.
  bool TakeChanged();
  // "0.50 0.25 …": the reported values of layers [first, last).
  std::string Format(int first, int last) const;

 private:
  std::vector<double> reported_;
  double event_delta_;
  bool changed_ = false;
};

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_DYNAMISM_LAYER_PROFILE_H_
