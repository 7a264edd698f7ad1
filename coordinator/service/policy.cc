#include "coordinator/service/policy.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dynmo::service {

absl::StatusOr<Trigger> ParseTrigger(absl::string_view text) {
  Trigger t;
  if (text == "auto") {
    t.kind = Trigger::Kind::kAuto;
    return t;
  }
  if (text == "on-event") {
    t.kind = Trigger::Kind::kOnEvent;
    return t;
  }
  if (text == "manual") {
    t.kind = Trigger::Kind::kManual;
    return t;
  }
  if (absl::StartsWith(text, "every:")) {
    int n = 0;
    if (!absl::SimpleAtoi(text.substr(6), &n) || n < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "trigger '", text, "': every:N needs an integer N >= 1"));
    }
    t.kind = Trigger::Kind::kEvery;
    t.every_iterations = n;
    return t;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown trigger '", text, "' (want every:N, on-event, auto, manual)"));
}

std::string TriggerName(const Trigger& trigger) {
  switch (trigger.kind) {
    case Trigger::Kind::kEvery:
      return absl::StrCat("every:", trigger.every_iterations);
    case Trigger::Kind::kOnEvent:
      return "on-event";
    case Trigger::Kind::kAuto:
      return "auto";
    case Trigger::Kind::kManual:
      return "manual";
  }
  return "auto";
}

AutoVerdict EvaluateAuto(const AutoOptions& options, const AutoInput& input) {
  AutoVerdict v;
  const double per_mb_gain =
      input.current_bottleneck_s - input.candidate_bottleneck_s;
  const int mb = input.microbatches > 0 ? input.microbatches : 1;
  v.gain_s = per_mb_gain * mb * options.horizon_iterations;
  v.migration_s = options.bandwidth_bytes_per_s > 0
                      ? static_cast<double>(input.migration_bytes) /
                            options.bandwidth_bytes_per_s
                      : 0;
  if (!(input.current_bottleneck_s > 0) || !(per_mb_gain > 0)) {
    v.why = "no predicted gain";
    return v;
  }
  if (per_mb_gain < options.noise_sigmas * input.gain_noise_s) {
    v.why = absl::StrFormat(
        "gain %.3gs per micro-batch within timing noise (%.1f sd of %.3gs)",
        per_mb_gain, options.noise_sigmas, input.gain_noise_s);
    return v;
  }
  const double relative = per_mb_gain / input.current_bottleneck_s;
  if (relative < options.min_relative_gain) {
    v.why = absl::StrFormat("gain %.2f%% below the %.2f%% threshold",
                            100 * relative, 100 * options.min_relative_gain);
    return v;
  }
  if (v.gain_s < options.payback_margin * v.migration_s) {
    v.why = absl::StrFormat(
        "gain %.6fs over %d iterations does not pay back %.6fs migration x%.1f",
        v.gain_s, options.horizon_iterations, v.migration_s,
        options.payback_margin);
    return v;
  }
  v.pays_back = true;
  v.why = absl::StrFormat("gain %.6fs pays back migration %.6fs", v.gain_s,
                          v.migration_s);
  return v;
}

bool AutoGate::Observe(const AutoVerdict& verdict, int64_t iteration) {
  if (!verdict.pays_back) {
    streak_ = 0;
    return false;
  }
  ++streak_;
  if (last_plan_iteration_ >= 0 &&
      iteration - last_plan_iteration_ < options_.cooldown_iterations) {
    return false;
  }
  return streak_ >= options_.confirmations;
}

void AutoGate::OnPlanIssued(int64_t iteration) {
  streak_ = 0;
  last_plan_iteration_ = iteration;
}

}  // namespace dynmo::service
