// When to rebalance: the one trigger grammar of DynMo. The coordinator
// (service/policy.h) and the trace replay (replay.h) both parse it here and
// each runs the kinds it can evaluate.
//
//   every:N         after every N-th iteration since the last decision: the
//                   paper's policy, which re-profiles and rebalances right
//                   after each dynamism event at a fixed frequency.
//   on-change[:T]   when the layers' times have drifted by more than T since
//                   the last decision (or since the start), measured as
//                   sum_i |t_i - t_i^ref| / sum_i t_i^ref with t = F + B + W.
//                   T defaults to 0.05. A model whose load does not change
//                   never pays for a decision. Replay only.
//   on-event        after a rank flagged "the model changed". Coordinator only.
//   auto            whenever new data arrives; whether the plan is issued is
//                   the payback gate's call (service/policy.h). Coordinator only.
//   manual          never on its own: only the operator's Rebalance decides.
//                   Coordinator only.
// Pure; thread-compatible.
#ifndef DYNMO_CORE_REBALANCE_TRIGGER_H_
#define DYNMO_CORE_REBALANCE_TRIGGER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/cost_model.h"

namespace dynmo::core {

inline constexpr double kDefaultChangeThreshold = 0.05;

struct RebalanceTrigger {
  enum class Kind { kEvery, kOnChange, kOnEvent, kAuto, kManual };
  Kind kind = Kind::kEvery;
  int every = 10;                              // kEvery
  double threshold = kDefaultChangeThreshold;  // kOnChange
};

// "every:N" (N >= 1), "on-change" or "on-change:T" (T finite, >= 0),
// "on-event", "auto" or "manual".
absl::StatusOr<RebalanceTrigger> ParseTrigger(absl::string_view text);
// The canonical text ParseTrigger reads back: "every:10", "on-change:0.05",
// "on-event", "auto", "manual".
std::string TriggerName(const RebalanceTrigger& trigger);

// Returns OK when `every` >= 1 and the threshold is finite and >= 0.
absl::Status ValidateTrigger(const RebalanceTrigger& trigger);

// sum_i |now_i - ref_i| / sum_i ref_i over F + B + W per layer. 0 when
// nothing changed; infinity when the reference is all zeros and `now` is
// not. Precondition: equal sizes.
double RelativeTimeChange(absl::Span<const LayerCost> reference,
                          absl::Span<const LayerCost> now);

// What a trigger looks at after new measurements.
struct TriggerInput {
  int64_t iterations_since_decision = 0;  // >= 1 once something ran
  double change = 0;           // RelativeTimeChange against the last decision
  bool model_changed = false;  // a rank flagged a change since the decision
};

// Whether to decide now. kAuto always fires (its gate judges the decision),
// kManual never does.
bool TriggerFires(const RebalanceTrigger& trigger, const TriggerInput& input);

}  // namespace dynmo::core

#endif  // DYNMO_CORE_REBALANCE_TRIGGER_H_
