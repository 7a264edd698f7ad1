// Rebalancer: when and to what one job rebalances. It owns the job's Policy,
// what the trigger remembers between ticks (the iteration of the last
// decision, the model changes decided on, the reports already considered),
// the auto trigger's gate (policy.h) and the measures of the layout in
// force. What the ranks reported (the newest iteration, model changes) it
// reads from the roster at each tick (RebalanceContext).
// Consider() runs the trigger and the balancer on the current model and
// returns the decision to issue as a plan, or nothing and a note saying why;
// Decide() is the operator's path, without the trigger.
//
// No I/O; the latency of each balancer run is kept for the caller's
// metrics (TakeDecisionLatencies). Thread-compatible: the job's lock guards it.
#ifndef DYNMO_COORDINATOR_JOB_REBALANCER_H_
#define DYNMO_COORDINATOR_JOB_REBALANCER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cost_model.h"
#include "core/cost_profile.h"
#include "core/measures.h"
#include "coordinator/job/decision.h"
#include "coordinator/job/job_layout.h"
#include "coordinator/job/policy.h"
#include "dynmo/v1/state.pb.h"

namespace dynmo::service {

// What the rest of the job tells the rebalancer at a tick.
struct RebalanceContext {
  const core::PipelineModel& model;
  const JobLayout& layout;
  const core::CostProfile& profile;  // its layer noise, for the auto gate
  int full_stages;                   // the job's pipeline size
  int data_parallel;                 // replicas per stage
  bool all_connected;                // every active rank has a session
  // The newest iteration a rank reported (RankRoster::newest_iteration).
  int64_t newest_iteration;
  // Reports that flagged a model change so far (RankRoster::model_changes):
  // more than at the last decision is a change not decided on yet.
  int64_t model_changes;
  // The newest iteration a report flagged as a model change
  // (RankRoster::model_changed_iteration; -1: none), and whether every
  // active rank reported it or later.
  int64_t model_changed_iteration;
  bool changed_costs_complete;
  // Each active rank's speed by position (DecisionInput::rank_speeds).
  std::vector<double> rank_speeds = {};
  // Iterations a plan decided now would run for before the run ends (its
  // planned iterations less the newest and the plan lead); < 0: unknown.
  int64_t iterations_left = -1;
  // An active rank's probes say it may have sped up, not yet confirmed
  // (core::RankSpeeds::may_be_faster): its layers look cheaper than they
  // are, so a plan now would load them onto other ranks at a false price;
  // auto waits for the probes. (A rank that may have slowed down is not
  // waited for: its layers look heavier, and the plans that follow move
  // them off it, the right way, while waiting would hold the job at the
  // straggler's pace.)
  bool speed_rising = false;
  // The job's minimum relative gain for auto (CalibratedMinGain); < 0:
  // AutoOptions::min_relative_gain.
  double min_relative_gain = -1;
  // An active rank has begun probing but has no speed yet (its first
  // probes, core::ProbeCadenceOptions::start_probes): priced at speed 1, a
  // straggler's layers look heavy in themselves and a plan now would stop
  // short of the split its speed calls for; auto waits the few iterations
  // its probes take. Also while a warm rank is in doubt (its level beyond
  // its published speed, not yet proven: core::RankSpeeds::in_doubt, a few
  // probes at most).
  bool speed_warming = false;
  // How much more than independent the layers' noise adds up on the
  // noisiest rank (JobSpeeds::NoiseInflation, >= 1): the auto gate's gain
  // noise is priced with the layers' deviations times its square root.
  double noise_inflation = 1;
  // The job's step time on the current layout, measured
  // (DecisionInput::measured_iteration_s); 0 = not known yet.
  double measured_iteration_s = 0;
  // A plan switched the layout and too few step times are in since
  // (PlanGains::MeasuringLayout): the first iterations after a switch.
  // Auto waits for them: a plan decided on the switch's own iterations
  // prices exchanges the old layout's waits set (the main job's second
  // plan, decided one iteration after the first's switch, predicted +37%
  // and +46% for +32% and +26% delivered).
  bool step_time_pending = false;
};

// A decision to issue, with the plan's reason.
struct Proposal {
  Decision decision;
  std::string reason;
};

class Rebalancer {
 public:
  Rebalancer(const Policy& policy, const AutoOptions& auto_options);

  const Policy& policy() const { return policy_; }
  void SetPolicy(const Policy& policy) { policy_ = policy; }
  // Evaluates at the next tick even without a new report.
  void Rearm() { rearmed_ = true; }

  // The job restarted from older state (a checkpoint): its iterations start
  // again lower, so the trigger's and gate's iteration marks start again.
  void OnResumed();
  // A restarted job's saved progress: its measures, shown until the first
  // complete profile replaces them, and the reports it had counted.
  void RestoreProgress(const dynmo::v1::JobProgress& progress);
  // The measures (not the iteration: the roster's).
  void SaveProgress(dynmo::v1::JobProgress* progress) const;
  // Whether a tick has work: the job's count of reports moved since the
  // last call, or Rearm/OnResumed asked.
  bool TakeDirty(int64_t reports);

  // Refreshes the measures of `layout` under `model` (kept when the
  // boundaries do not fit it).
  void Measure(const core::PipelineModel& model, const JobLayout& layout);
  const core::PartitionSummary& measures() const { return measures_; }
  double bubble() const { return bubble_; }

  // The trigger, then the balancer, then (auto) the payback gate.
  std::optional<Proposal> Consider(const RebalanceContext& context);
  // The operator's "decide now": the balancer without the trigger. A
  // proposal (reason "operator", "+repack" when it releases stages), or none
  // when the layout is already optimal, which `*detail` then says.
  absl::StatusOr<std::optional<Proposal>> DecideNow(
      const core::PipelineModel& model, const JobLayout& layout,
      int full_stages, int data_parallel, const std::vector<double>& rank_speeds,
      double measured_iteration_s, std::string* detail);
  // A plan was issued at the job's newest iteration `iteration`: the auto
  // trigger's cool-down starts.
  void OnPlanIssued(int64_t iteration);
  // The wall time of each balancer run since the last call, in seconds.
  std::vector<double> TakeDecisionLatencies() { return std::move(latencies_s_); }

  // Why the last evaluation issued no plan (diagnostics).
  const std::string& note() const { return note_; }
  void Note(std::string note) { note_ = std::move(note); }

 private:
  // The policy's balancer, timed for the metrics.
  absl::StatusOr<Decision> Decide(const core::PipelineModel& model,
                                  const JobLayout& layout, int full_stages,
                                  int data_parallel, const std::vector<double>& rank_speeds,
                                  double measured_iteration_s, double near_tie = 0);
  // `layer_noise`: the profile's LayerNoise(), read once per evaluation
  // (a copy: scaled by the job's noise inflation here).
  bool AutoGatePasses(const RebalanceContext& context, const Decision& d,
                      std::vector<double> layer_noise);

  Policy policy_;
  AutoOptions auto_options_;
  AutoGate gate_;
  std::vector<double> latencies_s_;
  int64_t last_decision_iteration_ = -1;
  int64_t decided_model_changes_ = 0;  // RebalanceContext::model_changes decided on
  int64_t considered_reports_ = 0;     // the report count TakeDirty last saw
  bool rearmed_ = false;
  core::PartitionSummary measures_;
  double bubble_ = 0;
  std::string note_;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_REBALANCER_H_
