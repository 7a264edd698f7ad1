// JobMachine: one training job's state as a machine — events in, effects
// out — with no lock, no clock, no log, no metric and no network of its
// own. What it composes lives beside it, one concept a file:
//
//   RankRoster (rank_roster.h)        ranks, coordinates, sessions
//   core::CostProfile                 smoothed per-layer costs and noise per
//     (core/cost_profile.h)           (replica, layer); the PipelineModel
//   JobLayout (job_layout.h)          active stages and boundaries in force
//   JobSpeeds (job_speeds.h)          each rank's speed and exchanges
//   Rebalancer (rebalancer.h)         the policy: trigger, balancer, gate
//   PlanLifecycle (plan_lifecycle.h)  a plan's life: PREPARE / COMMIT /
//                                     ABORT / applied / adopted, and what
//                                     it realized
//   job_record.h                      the job as JobRecord / JobStatus / ...
//   job_machine_plan.cc               a plan's outcome carried out on the job
//   upstream_checks.h                 what a rank's message must pass
//
// Events are a registration, a session attached or detached, a rank's
// reports and acks, a tick, the operator's "decide now" and a new policy;
// each takes the time it happens at. Effects (JobEffects) are what the
// caller must carry out afterwards, in order: sessions to close, messages to
// send, events to log, counters to add, GPUs released to the pool.
//
// The one thing the machine must know the outcome of before it goes on is
// whether its record became durable: a PREPARE or COMMIT may not name an
// epoch a restart would forget, and a plan whose record could not be saved
// is retracted. It asks that of a JobJournal (job_journal.h): the daemon's
// state keeper, or a replay's journal that keeps nothing (job_replay.h).
//
// JobState (job_state.h) is the daemon's shell around it: the lock, the
// send queue, persistence, the event log and the metrics. The simulator's
// replay (job_replay.h) drives the same machine with a trace's samples, so
// both decide with one code path.
//
// Thread-compatible: the owner serialises every call.
#ifndef DYNMO_COORDINATOR_JOB_JOB_MACHINE_H_
#define DYNMO_COORDINATOR_JOB_JOB_MACHINE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/cost_profile.h"
#include "core/rank_speed.h"
#include "coordinator/job/decision.h"
#include "coordinator/job/job_effects.h"
#include "coordinator/job/log_field.h"
#include "coordinator/job/job_journal.h"
#include "coordinator/job/job_layout.h"
#include "coordinator/job/job_record.h"
#include "coordinator/job/job_speeds.h"
#include "coordinator/job/plan_lifecycle.h"
#include "coordinator/job/policy.h"
#include "coordinator/job/rank_roster.h"
#include "coordinator/job/rebalancer.h"
#include "coordinator/job/session_sink.h"
#include "dynmo/v1/agent.pb.h"
#include "dynmo/v1/operator.pb.h"
#include "dynmo/v1/state.pb.h"

namespace dynmo::service {

// Coordinator-wide knobs every job shares.
struct JobOptions {
  Policy default_policy;
  AutoOptions auto_options;
  int plan_lead_iterations = 10;  // apply_iteration = newest iteration + lead
  absl::Duration prepare_timeout = absl::Seconds(10);
  // One-phase plans: the PREPARE is also the commit, and the ranks' in-band
  // agreement at the apply iteration decides (docs/protocol.md). Halves the
  // messages per plan; requires trainers that do the in-band MIN.
  bool in_band_commit = false;
  double smoothing = 0.5;         // EWMA weight of a new sample, (0, 1]
  // EWMA weight of a new sample in each layer's timing-noise estimate
  // (core/cost_noise.h): slower than `smoothing`, so the spread is taken
  // over ~20 samples, not the ~3 the cost estimate follows.
  double noise_smoothing = 0.1;
  int history_limit = 32;
  // How ranks' speed probes become speeds (core/rank_speed.h).
  core::RankSpeedOptions speed;
  // A report's or ack's iteration more than this far beyond the job's
  // newest is refused (INVALID_ARGUMENT): one bogus iteration would push
  // every later plan's apply iteration out of reach.
  int64_t iteration_window = 1'000'000;
  // A registering rank's applied or pending epoch more than this far beyond
  // the job's epoch is refused; within it, a newer applied epoch is adopted
  // (the state dir was lost). Reports and acks may never name an epoch
  // beyond the job's.
  uint64_t epoch_window = 1'000'000;
  // The level of the plan events (plan_issued, plan_committed,
  // plan_applied, repack; event_log.h): info, or debug where the operator
  // wants them out of the log (dynmo-coordinator --log_plans=false). An
  // aborted plan is always a warning.
  LogLevel plan_event_level = LogLevel::kInfo;
};

class JobMachine {
 public:
  // A new job shaped by its first registration (already validated).
  // `owner`: the principal that created it (auth.h; empty when unnamed).
  // `journal` (not owned) outlives the machine.
  JobMachine(const dynmo::v1::RegisterRequest& first, const JobOptions& options,
             JobJournal* journal, std::string owner = "");
  // A job restored from the state dir. A plan that was still PREPARING is
  // aborted (no rank can have committed it: `out->plans_aborted`); a
  // COMMITTED one stays in flight until reports or re-registrations
  // resolve it.
  JobMachine(const dynmo::v1::JobRecord& record, const JobOptions& options,
             JobJournal* journal, absl::Time now, JobEffects* out);

  JobMachine(const JobMachine&) = delete;
  JobMachine& operator=(const JobMachine&) = delete;

  const std::string& name() const { return name_; }
  const std::string& owner() const { return owner_; }

  // Registers (or re-registers) ranks, all or nothing: any error leaves the
  // job unchanged. The requests are already validated one by one and among
  // themselves. Errors: shape mismatch with the job (FAILED_PRECONDITION),
  // coordinates taken by another rank, epochs beyond the window, or an
  // adopted epoch that could not be made durable.
  absl::Status Register(
      absl::Span<const dynmo::v1::RegisterRequest* const> requests, absl::Time now,
      std::vector<dynmo::v1::RegisterResponse>* responses, JobEffects* out);
  // Binds registered ranks to `sink`, all or nothing. A one-rank session
  // (`host` false) presents the key its newest Register issued
  // (PERMISSION_DENIED otherwise); a multiplexed one (`host` true) may not
  // take a rank a live session of another host carries (ALREADY_EXISTS).
  // Older sessions of these ranks are closed and the in-flight plan is
  // re-sent once for all of them.
  absl::Status Attach(absl::Span<const int> ranks,
                      absl::Span<const std::string> session_keys, bool host,
                      std::shared_ptr<SessionSink> sink, JobEffects* out);
  // Unbinds `sink` from those of `ranks` it still serves.
  void Detach(absl::Span<const int> ranks, const SessionSink* sink);
  // Every session, unbound (the job is being deleted).
  std::vector<SessionRanks> DetachAll() { return roster_.DetachAll(); }

  // Reports and acks, in order: every message is checked before any is
  // applied, so a refused batch changes nothing.
  absl::Status OnUpstream(absl::Span<const UpstreamMessage> messages,
                          absl::Time now, JobEffects* out);
  // Timeouts of an in-flight plan, the measures, the trigger.
  void Tick(absl::Time now, JobEffects* out);
  // The operator's "decide now".
  absl::StatusOr<dynmo::v1::RebalanceResponse> Rebalance(absl::Time now,
                                                         JobEffects* out);
  // Parses, persists and installs a policy; the old one stays on error.
  absl::StatusOr<dynmo::v1::Policy> SetPolicy(const dynmo::v1::Policy& policy);

  // ---- Views ----
  dynmo::v1::JobSummary Summary() const { return MakeJobSummary(Parts()); }
  dynmo::v1::JobStatus Status() const;
  std::vector<dynmo::v1::GpuPlacement> Placements() const {
    return MakePlacements(Parts());
  }
  dynmo::v1::JobRecord Record() const { return MakeJobRecord(Parts()); }
  int connected() const { return roster_.connected(); }
  const RankRoster& roster() const { return roster_; }
  const JobLayout& layout() const { return layout_; }
  const Rebalancer& rebalancer() const { return rebalancer_; }
  const PlanLifecycle& plans() const { return plans_; }
  const core::RankSpeeds& speeds() const { return speeds_.ranks(); }
  // The job's PipelineModel from the profile, each active stage at its
  // slowest replica's speed, or FAILED_PRECONDITION while some (replica,
  // layer) has no sample yet.
  absl::StatusOr<core::PipelineModel> Model() const { return ModelAt(PositionSpeeds()); }
  // The same, the replicas' speeds given as PositionSpeeds() returns them.
  absl::StatusOr<core::PipelineModel> ModelAt(const std::vector<double>& position_speeds) const;
  // Each active rank's speed by position (JobSpeeds::PositionSpeeds).
  std::vector<double> PositionSpeeds() const {
    return speeds_.PositionSpeeds(roster_, layout_);
  }

  // Writes the record to the journal.
  absl::Status Persist() { return journal_->CommitJob(Record()); }
  // A diagnostic for the job's status (why the last evaluation issued no
  // plan; a persistence failure the shell met).
  void Note(std::string note) { rebalancer_.Note(std::move(note)); }

 private:
  JobMachine(JobShape shape, const JobOptions& options, JobJournal* journal,
             uint64_t epoch, std::string owner);

  JobParts Parts() const;

  // The rebalancer's measures of the layout in force.
  void Measure(const core::PipelineModel& model, JobEffects* out);
  // Iterations a plan decided now would run before the job's planned end;
  // -1 when no rank named one.
  int64_t IterationsLeft() const;
  // The policy's balancer, timed for the metrics.

  // ---- Plans (job_machine_plan.cc) ----
  // The decision as a plan, issued through the lifecycle (durable first).
  absl::StatusOr<dynmo::v1::Plan> Issue(const Decision& decision,
                                        const std::string& reason, absl::Time now,
                                        JobEffects* out);
  // Carries out what the plan lifecycle asked for, in its order: the
  // layout switched, the record persisted, then its effects into `out`.
  // Returns the persistence error of a record that had to be durable
  // first (its Undurable() outcome already carried), else OK.
  absl::Status Carry(PlanReady ready, absl::Time now, JobEffects* out);
  // The layout becomes `plan`'s: the GPUs it releases (and the repack
  // event) and its re-shape go to `out`.
  void SwitchLayout(const dynmo::v1::Plan& plan, absl::Time now, JobEffects* out);
  // A re-shaping plan's effects on the roster, the layout and the profile.
  void Reshape(const dynmo::v1::Reshape& reshape);
  void Log(LogLevel level, std::string name, std::vector<LogField> fields,
           JobEffects* out) {
    out->events.push_back(JobEvent{level, std::move(name), std::move(fields)});
  }

  const std::string name_;
  const std::string owner_;
  const JobOptions options_;
  JobJournal* const journal_;
  RankRoster roster_;
  core::CostProfile profile_;
  JobLayout layout_;
  Rebalancer rebalancer_;
  PlanLifecycle plans_;
  JobSpeeds speeds_;
  int64_t reports_ = 0;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_JOB_MACHINE_H_
