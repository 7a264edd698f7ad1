#include "coordinator/job/policy.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dynmo::service {

absl::StatusOr<Trigger> ParseTrigger(absl::string_view text) {
  absl::StatusOr<Trigger> t = core::ParseTrigger(text);
  if (t.ok() && t->kind == Trigger::Kind::kOnChange) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trigger '", text, "' is the trace replay's (dynmo-sim); the "
        "coordinator runs every:N, on-event, auto or manual"));
  }
  return t;
}

absl::StatusOr<Elastic> ParseElastic(absl::string_view text) {
  if (text == "release") return Elastic::kRelease;
  if (text == "reshape") return Elastic::kReshape;
  return absl::InvalidArgumentError(
      absl::StrCat("elastic must be release or reshape, got '", text, "'"));
}

std::string ElasticName(Elastic elastic) {
  return elastic == Elastic::kReshape ? "reshape" : "release";
}

TriggerCall EvaluateTrigger(const Trigger& trigger, const TriggerState& state) {
  TriggerCall call;
  core::TriggerInput in;
  in.iterations_since_decision = state.iterations_since_decision;
  in.model_changed = state.model_changed;
  if (!core::TriggerFires(trigger, in)) return call;
  if (trigger.kind == Trigger::Kind::kOnEvent && !state.changed_costs_complete) {
    call.note = "model changed: waiting for every rank's new costs";
    return call;  // stays armed
  }
  call.decide = true;
  call.reason = TriggerName(trigger);
  return call;
}

namespace {

AutoVerdict EvaluateGain(const AutoOptions& options, const AutoInput& input) {
  AutoVerdict v;
  const double per_mb_gain =
      input.current_bottleneck_s - input.candidate_bottleneck_s;
  const int mb = input.microbatches > 0 ? input.microbatches : 1;
  const int64_t horizon =
      input.iterations_left < 0
          ? options.horizon_iterations
          : std::min<int64_t>(options.horizon_iterations, input.iterations_left);
  v.gain_s = per_mb_gain * mb * static_cast<double>(horizon);
  v.gain_per_iteration_s = per_mb_gain * mb;
  v.iteration_s = input.current_bottleneck_s * mb;
  v.migration_s = options.bandwidth_bytes_per_s > 0
                      ? static_cast<double>(input.migration_bytes) /
                            options.bandwidth_bytes_per_s
                      : 0;
  if (!(input.current_bottleneck_s > 0) || !(per_mb_gain > 0)) {
    v.why = "no predicted gain";
    return v;
  }
  const bool has_stage = input.current_stage_s > 0 && input.candidate_stage_s > 0;
  const double stage_gain =
      has_stage ? input.current_stage_s - input.candidate_stage_s : per_mb_gain;
  if (stage_gain < options.noise_sigmas * input.gain_noise_s) {
    v.why = absl::StrFormat(
        "gain %.3gs per micro-batch within timing noise (%.1f sd of %.3gs)",
        stage_gain, options.noise_sigmas, input.gain_noise_s);
    return v;
  }
  // Calibrated, the job's own prediction error bounds the predicted step
  // time's gain it was measured on; until then the fixed minimum bounds
  // the slowest stage's, the balancer's objective.
  const bool calibrated = input.min_relative_gain >= 0;
  const bool by_stage = !calibrated && has_stage;
  const double relative = by_stage ? stage_gain / input.current_stage_s
                                   : per_mb_gain / input.current_bottleneck_s;
  const double min_gain = calibrated ? input.min_relative_gain : options.min_relative_gain;
  if (relative < min_gain) {
    v.why = absl::StrFormat("%s gain %.2f%% below the %.2f%% threshold%s",
                            by_stage ? "slowest stage's" : "step time's", 100 * relative,
                            100 * min_gain, calibrated ? " (calibrated)" : "");
    return v;
  }
  if (horizon <= 0) {
    v.why = "the run ends before the plan would apply";
    return v;
  }
  if (v.gain_s < options.payback_margin * v.migration_s) {
    v.why = absl::StrFormat(
        "gain %.6fs over %d iterations does not pay back %.6fs migration x%.1f",
        v.gain_s, horizon, v.migration_s, options.payback_margin);
    return v;
  }
  v.pays_back = true;
  v.why = absl::StrFormat("gain %.6fs pays back migration %.6fs", v.gain_s,
                          v.migration_s);
  return v;
}

}  // namespace

AutoVerdict EvaluateAuto(const AutoOptions& options, const AutoInput& input) {
  AutoVerdict v = EvaluateGain(options, input);
  if (input.releases_gpus) v.pays_back = true;
  v.releases_gpus = input.releases_gpus;
  return v;
}

bool AutoGate::Observe(const AutoVerdict& verdict, int64_t iteration,
                       int64_t settled_change) {
  if (!verdict.pays_back) {
    streak_ = 0;
    forgone_s_ = 0;
    streak_iteration_ = -1;
    return false;
  }
  ++streak_;
  // Each iteration of the streak forgoes the gain once (several evaluations
  // of one iteration count once).
  const int64_t iterations = streak_iteration_ < 0 ? 1 : iteration - streak_iteration_;
  if (iterations > 0) {
    forgone_s_ += static_cast<double>(iterations) * std::max(0.0, verdict.gain_per_iteration_s);
    streak_iteration_ = iteration;
  }
  if (last_plan_iteration_ >= 0 && settled_change <= last_plan_iteration_ &&
      iteration - last_plan_iteration_ < options_.cooldown_iterations) {
    return false;
  }
  if (!verdict.releases_gpus && verdict.migration_s > verdict.iteration_s &&
      forgone_s_ < verdict.migration_s) {
    return false;
  }
  return streak_ >= options_.confirmations;
}

void AutoGate::OnPlanIssued(int64_t iteration) {
  streak_ = 0;
  forgone_s_ = 0;
  streak_iteration_ = -1;
  last_plan_iteration_ = iteration;
}

double CalibratedMinGain(const AutoOptions& options,
                         const core::PredictionRecord& record) {
  const std::optional<double> shortfall = record.MedianShortfall();
  if (!shortfall.has_value()) return options.min_relative_gain;
  const double bound = std::max(*shortfall, record.MedianSpread().value_or(0));
  return std::clamp(bound, options.calibrated_min_gain_floor,
                    options.calibrated_min_gain_cap);
}

}  // namespace dynmo::service
