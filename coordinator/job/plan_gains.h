// PlanGains: one job's applied plans followed to what they delivered — the
// participants' step times (core::StepTimes), the plan applied last until
// the iterations after its switch are in, and the newest plans' shortfalls
// (core::PredictionRecord) the auto gate calibrates by. PlanLifecycle feeds
// it and records each measurement in the plan's history.
//
// Thread-compatible: the owner serialises every call.
#ifndef DYNMO_COORDINATOR_JOB_PLAN_GAINS_H_
#define DYNMO_COORDINATOR_JOB_PLAN_GAINS_H_

#include <cstdint>
#include <deque>
#include <limits>
#include <optional>

#include "core/realized_gain.h"

namespace dynmo::service {

class PlanGains {
 public:
  struct Measured {
    uint64_t epoch = 0;
    int64_t apply_iteration = 0;
    double predicted = 0;
    core::RealizedGain realized;
  };

  // A participant's step time (0 or bad values are ignored).
  void AddStep(int64_t iteration, double seconds) { steps_.Add(iteration, seconds); }
  // A participant reported the model changed at `iteration`. A plan whose
  // windows hold such an iteration past their first is measured with
  // RealizedGain::model_changed set (its realized gain holds the model's
  // change as well as its own) and enters the record only when it fell
  // short of its prediction: an uncertain miss may tighten the auto gate,
  // an uncertain delivery does not loosen it.
  void NoteModelChange(int64_t iteration);
  // Follows the plan `epoch` applied at `apply_iteration`, predicted to gain
  // `predicted`. The plan followed before is measured now, on the
  // iterations before this one's switch.
  std::optional<Measured> Follow(uint64_t epoch, int64_t apply_iteration, double predicted);
  // The plan followed, measured once the iterations after its switch are in.
  std::optional<Measured> Due();
  // The job restarted from older state: step times and the plan followed
  // say nothing about what runs now.
  void Forget();
  // A plan measured before (a restored record), recorded by the same rule.
  void Restore(double predicted, const core::RealizedGain& realized) {
    Record(predicted, realized);
  }
  const core::PredictionRecord& record() const { return record_; }
  // Whether `iteration` is one of the iterations around a switch that no
  // measurement counts (GainWindows::skip: the one preparing, the
  // migration's, the first on the new layout) — of the newest followed
  // plan, or of the plan in flight applying at `pending_apply` (< 0: none).
  bool AroundSwitch(int64_t iteration, int64_t pending_apply = -1) const {
    auto near = [&](int64_t a) {
      return a >= 0 && iteration >= a - windows_.skip && iteration <= a + windows_.skip;
    };
    // The followed plan's apply iteration, from the first one measured
    // after it (Follow: since_ = apply + skip + 1).
    return near(since_ >= 0 ? since_ - windows_.skip - 1 : -1) || near(pending_apply);
  }
  // The job's step time on the layout it runs now (core::CurrentStepTime
  // from the first iteration after the newest plan's switch); nullopt
  // until enough of them are in.
  std::optional<double> CurrentStepTime() const {
    return core::CurrentStepTime(steps_, since_, windows_);
  }
  // A plan switched the layout, the job reports step times, too few are in
  // since, and the job's newest iteration is within a window's length of
  // the switch (a job whose step times stopped is not waited for). Not at
  // the job's start: there the speed probes hold the first plan over the
  // same iterations.
  bool MeasuringLayout(int64_t newest_iteration) const {
    return since_ >= 0 && steps_.newest() >= 0 && newest_iteration < since_ + windows_.before &&
           !CurrentStepTime();
  }

 private:
  // The plan followed, on the step times before iteration `end` (nothing
  // when too few were reported); it is followed no more.
  std::optional<Measured> Measure(int64_t end);
  // Adds a measurement to the record: one across a model change only when
  // it fell short of its prediction (NoteModelChange).
  void Record(double predicted, const core::RealizedGain& realized);

  core::GainWindows windows_;
  core::StepTimes steps_;
  std::optional<Measured> following_;  // realized unset
  int64_t since_ = -1;  // the current layout's first measured iteration
  std::deque<int64_t> changes_;  // the newest model-change iterations, ascending
  core::PredictionRecord record_;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_PLAN_GAINS_H_
