// When to rebalance: after each profiled iteration the replay (replay.h) asks
// the trigger whether to run the balancer on that iteration's profile.
//
//   every:N         after every N-th iteration since the last decision: the
//                   paper's policy, which re-profiles and rebalances right
//                   after each dynamism event at a fixed frequency.
//   on-change[:T]   when the layers' times have drifted by more than T since
//                   the last decision (or since the start), measured as
//                   sum_i |t_i - t_i^ref| / sum_i t_i^ref with t = F + B + W.
//                   T defaults to 0.05. A model whose load does not change
//                   never pays for a decision.
// Pure; thread-compatible.
#ifndef DYNMO_COORDINATOR_CORE_REBALANCE_TRIGGER_H_
#define DYNMO_COORDINATOR_CORE_REBALANCE_TRIGGER_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "coordinator/core/cost_model.h"

namespace dynmo::core {

inline constexpr double kDefaultChangeThreshold = 0.05;

struct RebalanceTrigger {
  enum class Kind { kEvery, kOnChange };
  Kind kind = Kind::kEvery;
  int every = 10;                              // kEvery
  double threshold = kDefaultChangeThreshold;  // kOnChange
};

// "every:N" (N >= 1), "on-change" or "on-change:T" (T finite, >= 0).
absl::StatusOr<RebalanceTrigger> ParseTrigger(absl::string_view text);
// The canonical text ParseTrigger reads back: "every:10", "on-change:0.05".
std::string TriggerName(const RebalanceTrigger& trigger);

// Returns OK when `every` >= 1 and the threshold is finite and >= 0.
absl::Status ValidateTrigger(const RebalanceTrigger& trigger);

// sum_i |now_i - ref_i| / sum_i ref_i over F + B + W per layer. 0 when
// nothing changed; infinity when the reference is all zeros and `now` is
// not. Precondition: equal sizes.
double RelativeTimeChange(absl::Span<const LayerCost> reference,
                          absl::Span<const LayerCost> now);

// Whether to decide now, `iterations_since_decision` iterations (>= 1) after
// the last decision, with the layers' times `change` (RelativeTimeChange)
// away from the ones that decision saw.
bool TriggerFires(const RebalanceTrigger& trigger,
                  int iterations_since_decision, double change);

}  // namespace dynmo::core

#endif  // DYNMO_COORDINATOR_CORE_REBALANCE_TRIGGER_H_
