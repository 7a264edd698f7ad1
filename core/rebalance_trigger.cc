#include "core/rebalance_trigger.h"

#include <cmath>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/cost_model.h"

namespace dynmo::core {

absl::StatusOr<RebalanceTrigger> ParseTrigger(absl::string_view text) {
  RebalanceTrigger t;
  absl::string_view rest = text;
  if (absl::ConsumePrefix(&rest, "every:")) {
    t.kind = RebalanceTrigger::Kind::kEvery;
    if (!absl::SimpleAtoi(rest, &t.every) || t.every < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "trigger '", text, "' wants every:N with an integer N >= 1"));
    }
    return t;
  }
  if (absl::ConsumePrefix(&rest, "on-change")) {
    t.kind = RebalanceTrigger::Kind::kOnChange;
    if (rest.empty()) return t;
    if (!absl::ConsumePrefix(&rest, ":") ||
        !absl::SimpleAtod(rest, &t.threshold) || !std::isfinite(t.threshold) ||
        t.threshold < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "trigger '", text,
          "' wants on-change or on-change:T with a number T >= 0"));
    }
    return t;
  }
  if (text == "on-event") {
    t.kind = RebalanceTrigger::Kind::kOnEvent;
    return t;
  }
  if (text == "auto") {
    t.kind = RebalanceTrigger::Kind::kAuto;
    return t;
  }
  if (text == "manual") {
    t.kind = RebalanceTrigger::Kind::kManual;
    return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown trigger '", text,
                   "' (want every:N, on-change[:T], on-event, auto or manual)"));
}

std::string TriggerName(const RebalanceTrigger& trigger) {
  switch (trigger.kind) {
    case RebalanceTrigger::Kind::kEvery:
      return absl::StrCat("every:", trigger.every);
    case RebalanceTrigger::Kind::kOnChange:
      return absl::StrCat("on-change:", trigger.threshold);
    case RebalanceTrigger::Kind::kOnEvent:
      return "on-event";
    case RebalanceTrigger::Kind::kAuto:
      return "auto";
    case RebalanceTrigger::Kind::kManual:
      return "manual";
  }
  return "auto";
}

absl::Status ValidateTrigger(const RebalanceTrigger& trigger) {
  if (trigger.kind == RebalanceTrigger::Kind::kEvery && trigger.every < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("trigger every:N needs N >= 1, got ", trigger.every));
  }
  if (trigger.kind == RebalanceTrigger::Kind::kOnChange &&
      !FiniteNonNegative(trigger.threshold)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trigger on-change needs a threshold >= 0, got ", trigger.threshold));
  }
  return absl::OkStatus();
}

double RelativeTimeChange(absl::Span<const LayerCost> reference,
                          absl::Span<const LayerCost> now) {
  double moved = 0, base = 0;
  for (size_t i = 0; i < reference.size() && i < now.size(); ++i) {
    moved += std::fabs(now[i].time_s() - reference[i].time_s());
    base += reference[i].time_s();
  }
  if (moved == 0) return 0;
  if (base == 0) return std::numeric_limits<double>::infinity();
  return moved / base;
}

bool TriggerFires(const RebalanceTrigger& trigger, const TriggerInput& input) {
  switch (trigger.kind) {
    case RebalanceTrigger::Kind::kEvery:
      return input.iterations_since_decision >= trigger.every;
    case RebalanceTrigger::Kind::kOnChange:
      return input.change > trigger.threshold;
    case RebalanceTrigger::Kind::kOnEvent:
      return input.model_changed;
    case RebalanceTrigger::Kind::kAuto:
      return true;
    case RebalanceTrigger::Kind::kManual:
      return false;
  }
  return false;
}

}  // namespace dynmo::core
