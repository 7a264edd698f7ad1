// PlanProtocol: the coordinator's half of the two-phase plan protocol
// (docs/protocol.md) for one job, as a state machine with no I/O: the
// counterpart of a rank's agent/rank_state.h. It holds the epochs, the plan
// in flight, which ranks prepared it, and the history of settled plans.
// Events (an ack, a report, a registration, a tick) return the step the
// rules call for; transitions return the message to send. The owner
// (JobState) sends the messages to the participating ranks, persists the
// job before a PREPARE or a COMMIT leaves, and moves the layout and
// releases GPUs when a plan is applied.
//
//   Issue                                   -> PREPARE to every participant
//   every participant PREPARED              -> kCommit: Commit() -> COMMIT
//   a FAILED ack; the prepare timeout or    -> kAbort: Abort() -> ABORT
//   the apply iteration reached while
//   preparing; a rank back without the
//   committed plan; a report of the apply
//   iteration under an older epoch
//   an APPLIED ack; a report of the apply   -> kApply: Apply() -> the plan
//   iteration under the plan; a rank back
//   with it applied
//
// A PREPARED after the commit asks for the COMMIT again (kResendCommit),
// never the PREPARE (which would draw another PREPARED and loop); a plan
// committed with its PREPARE (commit_with_prepare, one phase) needs nothing.
// Acks of settled epochs are no-ops. Times are passed in: no clock.
//
// Not thread-safe: the owner serialises every call under its lock.
#ifndef DYNMO_COORDINATOR_JOB_PLAN_PROTOCOL_H_
#define DYNMO_COORDINATOR_JOB_PLAN_PROTOCOL_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "dynmo/v1/agent.pb.h"
#include "dynmo/v1/plan.pb.h"
#include "dynmo/v1/state.pb.h"

namespace dynmo::service {

struct PlanProtocolOptions {
  std::string job;  // names the job in error messages
  absl::Duration prepare_timeout = absl::Seconds(10);
  int history_limit = 32;  // settled plans kept
};

// What an event asks of the owner.
struct PlanStep {
  enum class Kind { kNone, kCommit, kAbort, kApply, kResendCommit };
  Kind kind = Kind::kNone;
  std::string why;  // kAbort, kApply: the outcome's detail
};

class PlanProtocol {
 public:
  // No plan yet, for ranks 0..num_ranks-1. Epochs continue after `epoch`
  // (the applied epoch of a rank that already ran plans: they never go
  // backwards), which also counts as applied.
  PlanProtocol(const PlanProtocolOptions& options, int num_ranks,
               uint64_t epoch);

  // Takes over the epochs, history and plan in flight of a restored record.
  // A plan that was still PREPARING is aborted (no rank can have committed
  // it) and true is returned; a COMMITTED one stays in flight, since `now`.
  bool Restore(const dynmo::v1::JobRecord& record, absl::Time now);
  // Writes the epochs, history and plan in flight into `record`.
  void ToRecord(dynmo::v1::JobRecord* record) const;

  uint64_t epoch() const { return epoch_; }  // the newest issued
  uint64_t applied_epoch() const { return applied_epoch_; }
  // A registering rank ran epoch `epoch`, newer than any issued here (the
  // state dir was lost or is older than the ranks): adopt it as issued and
  // applied, so that the next plan is newer than anything applied.
  void AdoptEpoch(uint64_t epoch);
  // The ranks run under `epoch` (<= the newest issued, newer than the
  // applied one) while no COMMITTED plan of that epoch is in flight: the
  // coordinator settled it otherwise (aborted it while the ranks had
  // agreed to switch) or lost that it was applied. The ranks are right: the
  // epoch becomes the applied one and its history record, if kept, turns
  // APPLIED with `why`. Returns the plan when the history knew it (its
  // layout is the one in force). Precondition: no plan in flight.
  std::optional<dynmo::v1::Plan> AdoptApplied(uint64_t epoch, const std::string& why,
                                              absl::Time now);

  // The plan in flight, or null.
  const dynmo::v1::PlanRecord* in_flight() const;
  const std::deque<dynmo::v1::PlanRecord>& history() const { return history_; }
  // "idle", "preparing" or "committed".
  const char* StateName() const;

  // FAILED_PRECONDITION while a plan is in flight.
  absl::Status CheckIdle() const;
  // A report that ran under `applied_epoch`: INVALID_ARGUMENT beyond the
  // newest epoch issued.
  absl::Status CheckReportEpoch(uint64_t applied_epoch) const;
  // An ack (already valid on its own) of `rank`: INVALID_ARGUMENT for an
  // epoch never issued, FAILED_PRECONDITION for APPLIED of a plan that was
  // never committed.
  absl::Status CheckAck(int rank, const dynmo::v1::PlanAck& ack) const;

  // Starts `plan` (every field but the epoch set): numbers it, marks it
  // PREPARING (COMMITTED if commit_with_prepare) and returns the PREPARE.
  // `participants` ranks must prepare it.
  dynmo::v1::CoordinatorMessage Issue(dynmo::v1::Plan plan, int participants,
                                      absl::Time now);
  // Undoes the Issue just made: its PREPARE never left (it could not be
  // persisted).
  void Retract();

  // The events; each returns what the rules call for.
  // Time passed while preparing, or the newest iteration came too close.
  PlanStep OnTick(absl::Time now, int64_t newest_iteration) const;
  // A rank of an active stage registered again with these epochs.
  PlanStep OnRegister(int rank, uint64_t applied_epoch,
                      uint64_t pending_epoch) const;
  // A participating rank reported `iteration`, run under `applied_epoch`.
  PlanStep OnReport(int rank, int64_t iteration, uint64_t applied_epoch) const;
  // An ack that passed CheckAck. `participates`: the rank must prepare.
  PlanStep OnAck(int rank, bool participates, const dynmo::v1::PlanAck& ack);

  // The transitions (precondition: a plan in flight).
  // PREPARING -> COMMITTED; returns the COMMIT.
  dynmo::v1::CoordinatorMessage Commit(absl::Time now);
  // The COMMIT of the plan in flight, again.
  dynmo::v1::CoordinatorMessage CommitMessage() const;
  // Settles the plan as aborted; returns the ABORT.
  dynmo::v1::CoordinatorMessage Abort(const std::string& why, absl::Time now);
  // Settles the plan as applied (its epoch is now the applied one); returns
  // the plan.
  dynmo::v1::Plan Apply(const std::string& why, absl::Time now);

  // What (re)attached ranks may have missed: the PREPARE (and the COMMIT)
  // of the plan in flight, for the ranks of active stages only; or, with
  // none in flight, the ABORT of the newest epoch, for every rank, so that
  // a rank holding it prepared drops it now instead of at its apply
  // iteration (harmless when it never saw it).
  struct Missed {
    bool active_ranks_only = false;
    std::vector<dynmo::v1::CoordinatorMessage> messages;
  };
  Missed MissedMessages() const;

 private:
  void Finish(dynmo::v1::PlanOutcome outcome, const std::string& detail,
              absl::Time now);
  void TrimHistory();

  PlanProtocolOptions options_;
  uint64_t epoch_;
  uint64_t applied_epoch_;
  uint64_t retracted_epoch_ = 0;  // epoch_ before the last Issue
  std::optional<dynmo::v1::PlanRecord> in_flight_;
  absl::Time in_flight_since_;
  int participants_ = 0;  // ranks that must prepare
  int prepared_count_ = 0;
  std::vector<bool> prepared_;  // per rank, for the plan in flight
  std::deque<dynmo::v1::PlanRecord> history_;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_PLAN_PROTOCOL_H_
