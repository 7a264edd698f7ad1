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

void PlanGains::Forget() {
  steps_ = core::StepTimes();
  following_.reset();
  since_ = -1;
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
  record_.Add(m.predicted, *g);
  return m;
}

}  // namespace dynmo::service
