#include "coordinator/job/plan_gains.h"

#include <algorithm>
#include <utility>

namespace dynmo::service {

std::optional<PlanGains::Measured> PlanGains::Follow(uint64_t epoch, int64_t apply_iteration,
                                                     double predicted) {
  std::optional<Measured> before = Measure(apply_iteration - windows_.skip);
  following_ = Measured{epoch, apply_iteration, predicted, {}};
  since_ = apply_iteration + windows_.skip + 1;
  return before;
}

std::optional<PlanGains::Measured> PlanGains::Due() {
  if (!following_ ||
      steps_.newest() < core::AfterWindowEnd(following_->apply_iteration, windows_)) {
    return std::nullopt;
  }
  return Measure(std::numeric_limits<int64_t>::max());
}

void PlanGains::NoteModelChange(int64_t iteration) {
  if (!changes_.empty() && changes_.back() == iteration) return;
  changes_.push_back(iteration);
  std::sort(changes_.begin(), changes_.end());
  constexpr size_t kKept = 64;  // far more than a window's iterations
  while (changes_.size() > kKept) changes_.pop_front();
}

void PlanGains::Forget() {
  steps_ = core::StepTimes();
  following_.reset();
  since_ = -1;
  changes_.clear();
}

std::optional<PlanGains::Measured> PlanGains::Measure(int64_t end) {
  if (!following_) return std::nullopt;
  Measured m = *std::exchange(following_, std::nullopt);
  // Cut short where the next plan switches.
  core::GainWindows windows = windows_;
  const int64_t first_after = m.apply_iteration + windows.skip + 1;
  windows.after = static_cast<int>(std::clamp<int64_t>(end - first_after, 0, windows.after));
  const std::optional<core::RealizedGain> g =
      core::MeasureRealizedGain(steps_, m.apply_iteration, windows);
  if (!g) return std::nullopt;
  m.realized = *g;
  // The windows span [first, last]: a change after the first iteration
  // measured and up to the last is in the measurement.
  const int64_t first = m.apply_iteration - windows.skip - windows.before;
  const int64_t last = first_after + windows.after - 1;
  m.realized.model_changed = std::any_of(changes_.begin(), changes_.end(), [&](int64_t c) {
    return c > first && c <= last;
  });
  Record(m.predicted, m.realized);
  return m;
}

void PlanGains::Record(double predicted, const core::RealizedGain& realized) {
  // Across a change the gate still learns of a miss (it tightens on an
  // uncertain shortfall, which is safe) but not of a delivery (loosening
  // on a gain the model's change may have brought is not).
  if (!realized.model_changed || realized.gain < predicted) record_.Add(predicted, realized);
}

}  // namespace dynmo::service
