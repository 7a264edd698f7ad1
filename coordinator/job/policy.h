// Policy: when a job rebalances and with what. A Policy names the balancer
// (a core::PartitionMethod), the trigger and whether to re-pack onto fewer
// GPUs. Triggers, of the one grammar core/rebalance_trigger.h parses (its
// on-change[:T] is the trace replay's and is refused here):
//
//   every:N   decide every N iterations (the paper's fixed frequency)
//   on-event  decide after a report flagged "the model changed"
//   auto      decide whenever new data arrives, but issue a plan only when the
//             predicted bottleneck gain (a) clears the timing noise: it is at
//             least `noise_sigmas` standard deviations of the gain that the
//             layers' measured noise alone would produce (core/cost_noise.h),
//             (b) pays back the predicted migration time (bytes / bandwidth)
//             over a horizon, by a margin, and (c) does so for several
//             consecutive evaluations, not within a cool-down after the last
//             plan, and (d) for a move that pauses the job longer than an
//             iteration's work, the gain the job has forgone while
//             confirming (the predicted gain per iteration, summed over the
//             iterations of the streak) has reached the move's predicted
//             pause: the break-even rule of ski rental. (a) keeps a
//             stationary job from chasing noise (A -> B -> A); (b) keeps it
//             from moving layers that cost more than they save; (c) is the
//             hysteresis against a single outlier; (d) keeps a costly move (a
//             re-shape copying terabytes) from chasing a change that lasts
//             fewer iterations than the move pauses for (a hot expert for
//             ten iterations), and leaves cheap moves as they were.
//             The coordinator's default: it follows any of the six dynamic
//             cases without the user choosing a frequency, and on a load
//             that does not move it issues nothing.
//   manual    only the operator's Rebalance RPC decides.
//
// EvaluateTrigger and EvaluateAuto are pure functions; AutoGate holds the
// hysteresis state of one job and is thread-compatible (the job's lock
// guards it).
#ifndef DYNMO_COORDINATOR_JOB_POLICY_H_
#define DYNMO_COORDINATOR_JOB_POLICY_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/partition.h"
#include "core/realized_gain.h"
#include "core/rebalance_trigger.h"
#include "core/reshape.h"

namespace dynmo::service {

using Trigger = core::RebalanceTrigger;

// Parses a trigger the coordinator runs: "every:N" (N >= 1), "on-event",
// "auto" or "manual"; "on-change[:T]" gets an error that says it is the
// replay's.
absl::StatusOr<Trigger> ParseTrigger(absl::string_view text);
using core::TriggerName;

// What a job's trigger looks at after new reports.
struct TriggerState {
  int64_t iterations_since_decision = 0;
  bool model_changed = false;  // a rank flagged it since the last decision
  // Every active rank reported the iteration of the newest change, or a
  // later one. on-event waits for it: otherwise the plan would mix one
  // stage's new costs with another's stale ones.
  bool changed_costs_complete = false;
};

struct TriggerCall {
  bool decide = false;
  std::string reason;  // the plan's reason when it decides: the trigger's name
  std::string note;    // why it keeps waiting, when that is worth telling
};

// Whether `trigger` decides now. auto always decides; whether its plan is
// issued is EvaluateAuto's and AutoGate's call on the decision.
TriggerCall EvaluateTrigger(const Trigger& trigger, const TriggerState& state);

// What re-packing does with the ranks it frees: hand them back to the
// scheduler, or keep them and re-shape the job into more data-parallel
// replicas of a shorter pipeline when the cost model (core/reshape.h)
// predicts more micro-batches per second than releasing.
enum class Elastic { kRelease, kReshape };

// "release" or "reshape".
absl::StatusOr<Elastic> ParseElastic(absl::string_view text);
std::string ElasticName(Elastic elastic);

struct Policy {
  core::PartitionMethod balancer = core::PartitionMethod::kOptimal;
  Trigger trigger{Trigger::Kind::kAuto};
  bool repack = false;
  double repack_tolerance = 0;  // >= 0, relative bottleneck loss allowed
  Elastic elastic = Elastic::kRelease;
};

// Knobs of the auto trigger; the defaults are deliberately conservative.
struct AutoOptions {
  int horizon_iterations = 200;           // how long a gain is counted
  double bandwidth_bytes_per_s = 10e9;    // migration link
  double payback_margin = 2.0;            // gain must be >= margin * cost
  // and >= this share of the slowest stage's time — until the job's own
  // plans have been measured: then the predicted step time's gain must be
  // >= the job's prediction error (CalibratedMinGain)
  double min_relative_gain = 0.05;
  // The calibrated minimum gain stays within [floor, cap].
  double calibrated_min_gain_floor = 0.02;
  double calibrated_min_gain_cap = 0.15;
  int confirmations = 3;                  // consecutive positive verdicts
  int cooldown_iterations = 20;           // after a plan was issued, unless the model changed
  // The gain must be >= this many standard deviations of the noise-only
  // gain (3: a stationary job's noise passes about 1 evaluation in 700,
  // and `confirmations` of them in a row practically never).
  double noise_sigmas = 3.0;
  // Layouts whose predicted bottlenecks differ by less than this many
  // standard deviations of a stage's time (core::StageRelativeNoise), and
  // at most max_near_tie of it, count as a tie: the balancer then picks the
  // one that moves the fewest bytes (core::PartitionOptions::near_tie)
  // instead of chasing the noise with a larger move.
  double near_tie_sigmas = 1.0;
  double max_near_tie = 0.005;
  // The cluster's data-parallel costs, for weighing a re-shape: the
  // gradient all-reduce and the copies to new replicas (core/reshape.h).
  core::DataParallelSpec data_parallel{25e9, 0.5, 4, 10e9};
};

struct AutoInput {
  // The job's step time per micro-batch now and under the candidate
  // (Decision's previous_ / predicted_bottleneck_s): the gain weighed.
  double current_bottleneck_s = 0;
  double candidate_bottleneck_s = 0;
  int64_t migration_bytes = 0;
  int microbatches = 1;
  double gain_noise_s = 0;  // sd of the per-micro-batch gain (cost_noise.h)
  // Re-packing releases GPUs at (nearly) no throughput loss: a gain in GPUs,
  // not in time, so such a candidate pays back on its own.
  bool releases_gpus = false;
  // Iterations the candidate would run before the run ends; the gain counts
  // over min(horizon, this). < 0: unknown (the horizon).
  int64_t iterations_left = -1;
  // The job's minimum relative gain (CalibratedMinGain); < 0: the options'.
  double min_relative_gain = -1;
  // The slowest stage's seconds per micro-batch now and under the
  // candidate (Decision's previous_ / predicted_stage_s), whose difference
  // is what gain_noise_s is the noise of; 0: the two above.
  double current_stage_s = 0;
  double candidate_stage_s = 0;
};

struct AutoVerdict {
  bool pays_back = false;
  double gain_s = 0;       // saved over the horizon
  double migration_s = 0;  // predicted cost of moving the layers
  double gain_per_iteration_s = 0;  // predicted, per iteration
  double iteration_s = 0;  // the job's predicted step time, now
  bool releases_gpus = false;  // pays back in GPUs: (d) does not apply
  std::string why;
};

// Returns whether moving to the candidate pays back over the horizon.
AutoVerdict EvaluateAuto(const AutoOptions& options, const AutoInput& input);

// The minimum relative gain a job's plan must be predicted to bring: how
// far the job's own realized plans fell short of their predictions (the
// median over the newest), or how far their measurements scattered,
// whichever is larger (a prediction is worth no more than that), within
// [calibrated_min_gain_floor, _cap]; options.min_relative_gain until a plan
// of the job was measured. A plan that falls short of its prediction
// raises it; plans that deliver lower it.
double CalibratedMinGain(const AutoOptions& options,
                         const core::PredictionRecord& record);

// The hysteresis of one job's auto trigger.
class AutoGate {
 public:
  explicit AutoGate(const AutoOptions& options) : options_(options) {}

  // Feeds the verdict of an evaluation at `iteration`; returns true when a
  // plan should be issued now (enough consecutive positive verdicts, the
  // gain forgone over them at least the move's pause, and the cool-down has
  // passed). `settled_change` is the newest model change (a rank's flag or
  // a speed that moved) whose costs every active rank has reported since,
  // -1 for none: one after the last plan was issued ends that plan's
  // cool-down, since the plan was decided for a model that no longer runs
  // (the confirmations and the payback still hold).
  bool Observe(const AutoVerdict& verdict, int64_t iteration, int64_t settled_change = -1);
  // Starts the cool-down and clears the confirmations.
  void OnPlanIssued(int64_t iteration);

 private:
  AutoOptions options_;
  int streak_ = 0;
  double forgone_s_ = 0;  // gain forgone over the streak's iterations
  int64_t streak_iteration_ = -1;  // the streak's newest iteration
  int64_t last_plan_iteration_ = -1;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_POLICY_H_
