// PlanLifecycle: the one owner of a plan's life in one job, from its issue
// to its outcome — PREPARE, every participant PREPARED, COMMIT, applied or
// aborted, or adopted from a rank that runs under it (docs/protocol.md) —
// as a state machine with no I/O, after etcd raft's Step / Ready: each
// event returns one PlanReady that says, in order, the layout to switch
// to, whether the job's record must become durable and how urgently, and
// the messages, events and counters that follow. The owner (JobMachine)
// switches the layout, persists, and only then releases the messages; when
// a record that had to be durable first (an issue, a commit) could not be
// saved it calls Undurable(), which retracts the issue or turns the commit
// into an abort. Nothing calls back into the owner. It is the counterpart
// of a rank's agent/rank_state.h.
//
// It also follows each applied plan to what it delivered: the prediction
// is recorded at issue (PlanRecord.predicted_gain), the ranks' step times
// (IterationReport.iteration_s) before and after the switch give the
// realized gain once the iterations after it are in (core/realized_gain.h;
// a plan_realized event, PlanRecord.realized_*), and the newest plans'
// errors are kept for the auto gate's calibration (predictions()).
//
//   Issue                                   -> PREPARE to every participant
//   every participant PREPARED              -> COMMIT (durable first)
//   a FAILED ack; the prepare timeout or    -> ABORT
//   the apply iteration reached while
//   preparing; a rank back without the
//   committed plan; a report of the apply
//   iteration under an older epoch
//   an APPLIED ack; a report of the apply   -> applied: the plan's layout
//   iteration under the plan; a rank back
//   with it applied
//   a rank under a newer epoch than the     -> adopted (its plan's layout,
//   applied one                                else the rank's); a plan in
//                                              flight from the older layout
//                                              aborted first
//
// A PREPARED after the commit draws the COMMIT again, to that rank only,
// never the PREPARE (which would draw another PREPARED and loop); a plan
// committed with its PREPARE (commit_with_prepare, one phase) needs
// nothing. Acks of settled epochs are no-ops. Times are passed in: no
// clock. The roster and layout it addresses messages by are the owner's
// and only read.
//
// Not thread-safe: the owner serialises every call under its lock.
#ifndef DYNMO_COORDINATOR_JOB_PLAN_LIFECYCLE_H_
#define DYNMO_COORDINATOR_JOB_PLAN_LIFECYCLE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "coordinator/job/job_effects.h"
#include "coordinator/job/job_layout.h"
#include "coordinator/job/log_field.h"
#include "coordinator/job/plan_gains.h"
#include "coordinator/job/rank_roster.h"
#include "dynmo/v1/agent.pb.h"
#include "dynmo/v1/plan.pb.h"
#include "dynmo/v1/state.pb.h"

namespace dynmo::service {

struct PlanLifecycleOptions {
  std::string job;  // names the job in messages and events
  absl::Duration prepare_timeout = absl::Seconds(10);
  int history_limit = 32;  // settled plans kept
  // The level of plan_issued, plan_committed and plan_applied (an aborted
  // plan and an adopted epoch are always warnings).
  LogLevel event_level = LogLevel::kInfo;
};

// What one event asks of the owner, in this order: switch the layout
// (`applied`, else `rank_layout`), make the record durable (`persist`),
// then carry out `effects` (messages, events, counters).
struct PlanReady {
  enum class Persist {
    kNo,
    kSettled,  // a settled plan: a failure is noted, the messages still go
    kFirst,    // an epoch named by the messages: a failure -> Undurable()
  };
  Persist persist = Persist::kNo;
  // The layout becomes this plan's (its released GPUs, its re-shape).
  std::optional<dynmo::v1::Plan> applied;
  // Else the layout becomes this registering rank's (valid during the call).
  const dynmo::v1::RegisterRequest* rank_layout = nullptr;
  // A registering rank's epoch, newer than any issued, was adopted: the
  // registration persists it before answering.
  bool epoch_adopted = false;
  // The job restarted from older state (a checkpoint): its iterations
  // start again lower (Rebalancer::OnResumed).
  bool resumed = false;
  JobEffects effects;

  // Adds `later` after this one (the later layout wins).
  void Merge(PlanReady later);
};

class PlanLifecycle {
 public:
  // No plan yet. Epochs continue after `epoch` (the applied epoch of a rank
  // that already ran plans: they never go backwards), which also counts as
  // applied. `roster` and `layout` (not owned) outlive this.
  PlanLifecycle(const PlanLifecycleOptions& options, const RankRoster* roster,
                const JobLayout* layout, uint64_t epoch);

  // Takes over the epochs, history and plan in flight of a restored record.
  // A plan that was still PREPARING is aborted (no rank can have committed
  // it) and true is returned; a COMMITTED one stays in flight, since `now`.
  bool Restore(const dynmo::v1::JobRecord& record, absl::Time now);
  // Writes the epochs, history and plan in flight into `record`.
  void ToRecord(dynmo::v1::JobRecord* record) const;

  // ---- Views ----
  uint64_t epoch() const { return epoch_; }  // the newest issued
  uint64_t applied_epoch() const { return applied_epoch_; }
  // The plan in flight, or null.
  const dynmo::v1::PlanRecord* in_flight() const;
  const std::deque<dynmo::v1::PlanRecord>& history() const { return history_; }
  // "idle", "preparing" or "committed".
  const char* StateName() const;
  // The newest realized plans' prediction errors and spreads.
  const core::PredictionRecord& predictions() const { return gains_.record(); }
  // The job's step time on its current layout (PlanGains::CurrentStepTime).
  std::optional<double> CurrentStepTime() const { return gains_.CurrentStepTime(); }
  bool MeasuringLayout(int64_t newest_iteration) const {
    return gains_.MeasuringLayout(newest_iteration);
  }
  // Whether `iteration` runs around a plan's switch (the plan in flight's
  // or the newest applied one's: PlanGains::AroundSwitch), where a rank's
  // exchanges carry the migration and the new layout's first waits.
  bool AroundSwitch(int64_t iteration) const {
    return gains_.AroundSwitch(iteration,
                               in_flight_ ? in_flight_->plan().apply_iteration() : -1);
  }

  // ---- Checks, before an event is applied ----
  // FAILED_PRECONDITION while a plan is in flight.
  absl::Status CheckIdle() const;
  // A report that ran under `applied_epoch`: INVALID_ARGUMENT beyond the
  // newest epoch issued.
  absl::Status CheckReportEpoch(uint64_t applied_epoch) const;
  // An ack (already valid on its own) of `rank`: INVALID_ARGUMENT for an
  // epoch never issued, FAILED_PRECONDITION for APPLIED of a plan that was
  // never committed.
  absl::Status CheckAck(int rank, const dynmo::v1::PlanAck& ack) const;

  // ---- Events ----
  // Starts `plan` (every field but the epoch set, no plan in flight):
  // numbers it, marks it PREPARING (COMMITTED if commit_with_prepare) and
  // sends the PREPARE to every participant once durable.
  PlanReady Issue(dynmo::v1::Plan plan, absl::Time now);
  // The last ready's kFirst record could not be made durable (`why`): an
  // issue is undone (its PREPARE never left), a commit becomes an abort.
  PlanReady Undurable(const absl::Status& why, absl::Time now);
  // An ack that passed CheckAck.
  PlanReady OnAck(int rank, const dynmo::v1::PlanAck& ack, absl::Time now);
  // A rank reported `iteration`, run under `applied_epoch`, which took it
  // `iteration_s` wall seconds (0: not measured).
  PlanReady OnReport(int rank, int64_t iteration, uint64_t applied_epoch,
                     double iteration_s, absl::Time now);
  // The rank's report of `iteration` says the model changed there: the
  // plans measured across it are marked (PlanGains::NoteModelChange).
  void OnModelChange(int rank, int64_t iteration);
  // A rank registers (again), before the roster takes it: its epochs
  // against the job's (adoption). A rank back from older state than the
  // applied plan — applied and pending epoch both older, at another layout:
  // a process restarted from a checkpoint, not one caught mid-switch — runs
  // the layout it names: that becomes the job's (layout_adopted), a plan in
  // flight is aborted, the epochs stay (the next plan is newer than any).
  PlanReady OnRegistering(const dynmo::v1::RegisterRequest& request,
                          absl::Time now);
  // ... and after: a committed plan in flight is settled by an active
  // rank back with or without it.
  PlanReady OnRegistered(const dynmo::v1::RegisterRequest& request,
                         absl::Time now);
  // Time passed while preparing, or the newest iteration came too close.
  PlanReady OnTick(absl::Time now, int64_t newest_iteration);
  // `ranks` (re)attached on `sink`: what they may have missed — the
  // PREPARE (and COMMIT) of the plan in flight for the ranks of active
  // stages, or with none in flight the ABORT of the newest epoch for every
  // rank (a rank holding it prepared drops it now; harmless otherwise).
  PlanReady OnAttach(const std::shared_ptr<SessionSink>& sink,
                     absl::Span<const int> ranks) const;

 private:
  enum class Pending { kNone, kIssue, kCommit };

  // The transitions (a plan in flight).
  PlanReady Commit(absl::Time now);
  PlanReady Abort(const std::string& why, absl::Time now);
  PlanReady Apply(const std::string& why, absl::Time now);
  // A rank runs under `epoch`, newer than the applied one (reported, or
  // named in a re-registration).
  PlanReady Adopt(int rank, uint64_t epoch,
                  const dynmo::v1::RegisterRequest* registered, absl::Time now);
  // A rank back from older state at another layout (OnRegistering).
  PlanReady AdoptResumed(const dynmo::v1::RegisterRequest& request, absl::Time now);
  // A plan's measured gain into its history record, the event and the
  // effects; nothing for none.
  PlanReady Realized(const std::optional<PlanGains::Measured>& measured);
  // The epoch_adopted warning: `rank` runs under `epoch`, the job had
  // `recorded`; `layout` says whose layout is now in force.
  void LogEpochAdopted(int rank, uint64_t epoch, uint64_t recorded, const char* layout,
                       PlanReady* ready) const;
  // `ready` switches to `plan` (applied with `why`): the plan_applied
  // event and counters.
  void Switch(dynmo::v1::Plan plan, const std::string& why, PlanReady* ready) const;
  void Log(LogLevel level, std::string name, std::vector<LogField> fields,
           JobEffects* out) const;
  void Finish(dynmo::v1::PlanOutcome outcome, const std::string& detail,
              absl::Time now);
  void TrimHistory();

  PlanLifecycleOptions options_;
  const RankRoster* const roster_;
  const JobLayout* const layout_;
  uint64_t epoch_;
  uint64_t applied_epoch_;
  uint64_t retracted_epoch_ = 0;  // epoch_ before the last Issue
  Pending pending_ = Pending::kNone;  // what the last kFirst ready was
  std::optional<dynmo::v1::PlanRecord> in_flight_;
  absl::Time in_flight_since_;
  int participants_ = 0;  // ranks that must prepare
  int prepared_count_ = 0;
  std::vector<bool> prepared_;  // per rank, for the plan in flight
  std::deque<dynmo::v1::PlanRecord> history_;
  PlanGains gains_;  // what the applied plans delivered
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_PLAN_LIFECYCLE_H_
