// JobState: one training job in the coordinator: the lock that serialises
// everything about it and the fan-out of its downstream messages. What it
// composes lives beside it, one concept a file:
//
//   RankRoster (rank_roster.h)        ranks, coordinates, sessions
//   core::CostProfile                 smoothed per-layer costs and noise per
//     (core/cost_profile.h)           (replica, layer); the PipelineModel
//   JobLayout (job_layout.h)          active stages and boundaries in force
//   Rebalancer (rebalancer.h)         the policy: trigger, balancer, gate
//   PlanProtocol (plan_protocol.h)    PREPARE / COMMIT / ABORT / applied
//   SendQueue (send_queue.h)          messages on their way to the sessions
//   job_record.h                      the job as JobRecord / JobStatus / ...
//   proto_convert.h, plan_convert.h   wire messages <-> plain structs
//   job_plan_effects.cc               what a plan step does to the job
//   job_checks.cc                     what a rank's message must pass
//                                     (values, epochs, the windows)
//   job_lifecycle.cc                  open, closed (deleted), idle since
//
// Ranks register with their pipeline / data-parallel coordinates; each rank
// then reports the per-layer costs of its own stage. Tick() evaluates the
// job's Policy on the combined profile and may issue a plan, which the plan
// protocol settles (docs/protocol.md). JobState sends what the protocol
// returns, persists the job before a PREPARE or a COMMIT leaves (so epochs
// never go backwards across kill -9), moves the layout when a plan is
// applied and hands the GPUs it released to the ReleasedPool.
//
// Thread-safe: one mutex per job; lock order job -> pool -> keeper.
// Downstream messages are queued under the job's lock and handed to the
// sinks after it is released (send_queue.h), in order, grouped per sink: a
// multiplexed session (SessionSink shared by several ranks) gets one message
// per broadcast listing the ranks it is for.
#ifndef DYNMO_COORDINATOR_SERVICE_JOB_STATE_H_
#define DYNMO_COORDINATOR_SERVICE_JOB_STATE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "coordinator/core/boundaries.h"
#include "coordinator/core/cost_profile.h"
#include "coordinator/service/decision.h"
#include "coordinator/service/event_log.h"
#include "coordinator/service/job_layout.h"
#include "coordinator/service/job_record.h"
#include "coordinator/service/metrics.h"
#include "coordinator/service/plan_protocol.h"
#include "coordinator/service/policy.h"
#include "coordinator/service/rank_roster.h"
#include "coordinator/service/rebalancer.h"
#include "coordinator/service/released_pool.h"
#include "coordinator/service/send_queue.h"
#include "coordinator/service/session_sink.h"
#include "coordinator/service/state_store.h"
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

// What a job needs from the rest of the coordinator. Not owned.
struct JobDeps {
  StateKeeper* keeper = nullptr;
  ReleasedPool* pool = nullptr;
  CoordinatorMetrics* metrics = nullptr;  // may be null (tests)
};

class JobState {
 public:
  // A new job shaped by its first registration (already validated).
  // `owner`: the principal that created it (auth.h; empty when unnamed).
  JobState(const dynmo::v1::RegisterRequest& first, const JobOptions& options,
           JobDeps deps, std::string owner = "");
  // A job restored from the state dir. A plan that was still PREPARING is
  // aborted (no rank can have committed it); a COMMITTED one stays in flight
  // until reports or re-registrations resolve it.
  JobState(const dynmo::v1::JobRecord& record, const JobOptions& options,
           JobDeps deps);

  JobState(const JobState&) = delete;
  JobState& operator=(const JobState&) = delete;

  const std::string& name() const { return name_; }
  const std::string& owner() const { return owner_; }

  // Registers (or re-registers) one rank. Errors: shape mismatch with the
  // job (FAILED_PRECONDITION), coordinates taken by another rank.
  absl::Status Register(const dynmo::v1::RegisterRequest& request,
                        dynmo::v1::RegisterResponse* response);
  // Registers several ranks at once (RegisterHost), all or nothing: any
  // error leaves the job unchanged. The requests are already validated one
  // by one and among themselves (ValidateRegisterHost).
  absl::Status RegisterMany(
      const google::protobuf::RepeatedPtrField<dynmo::v1::RegisterRequest>& requests,
      std::vector<dynmo::v1::RegisterResponse>* responses);
  // Binds a registered rank's session, which presents the key its newest
  // Register issued (RegisterResponse.session_key; PERMISSION_DENIED
  // otherwise); replaces (and closes) an older one and re-sends whatever
  // plan message the rank may have missed.
  absl::Status Attach(int rank, absl::string_view session_key,
                      std::shared_ptr<SessionSink> sink);
  // Unbinds `sink` if it is still the rank's session.
  void Detach(int rank, const SessionSink* sink);
  // Binds several registered ranks to one multiplexed session, all or
  // nothing: NOT_FOUND for a rank outside the job, FAILED_PRECONDITION for
  // an unregistered one, ALREADY_EXISTS for a rank carried by a live session
  // of another host. Replaces (and closes) older sessions of these ranks and
  // re-sends the in-flight plan once for all of them.
  absl::Status AttachHost(absl::Span<const int> ranks,
                          absl::Span<const std::string> session_keys,
                          std::shared_ptr<SessionSink> sink);
  // Unbinds `sink` from those of `ranks` it still serves.
  void DetachHost(absl::Span<const int> ranks, const SessionSink* sink);
  // The upstream messages of one HostBatch, in order, under one lock. Every
  // message is checked before any is applied, so a bad batch changes
  // nothing. The caller checked that each rank is carried by the session.
  absl::Status OnHostBatch(const dynmo::v1::HostBatch& batch);

  absl::Status OnReport(int rank, const dynmo::v1::IterationReport& report);
  absl::Status OnAck(int rank, const dynmo::v1::PlanAck& ack);

  // Timeouts of an in-flight plan, measures and metrics, the trigger.
  void Tick(absl::Time now);
  // The operator's "decide now".
  absl::StatusOr<dynmo::v1::RebalanceResponse> Rebalance(absl::Time now);
  absl::StatusOr<dynmo::v1::Policy> SetPolicy(const dynmo::v1::Policy& policy);

  dynmo::v1::JobSummary Summary() const;
  dynmo::v1::JobStatus Status() const;
  // Each registered rank's device and place in the job's grid, or released
  // (SchedulerService.ListPlacements).
  std::vector<dynmo::v1::GpuPlacement> Placements() const;
  // The durable record (what the state dir holds for this job).
  dynmo::v1::JobRecord Record() const;

  // Deletion (JobRegistry::Delete). Close ends every session with `why`,
  // removes the job's metric series, and makes every later call of the
  // job's ranks NOT_FOUND ("job was deleted"), so nothing it still holds
  // can act or persist. Returns the number of sessions ended. Reopen undoes
  // it when the deletion could not be made durable.
  int Close(const std::string& why);
  void Reopen();
  // When the job went idle: the last registration, session change, report
  // or ack while no rank is connected; InfiniteFuture while one is.
  absl::Time IdleSince() const;
  // Writes the record to the keeper and commits.
  absl::Status Persist();

 private:
  // Sends what was queued once it goes out of scope: declared before the
  // MutexLock, it runs after the lock is released.
  class FlushOnExit;

  JobState(JobShape shape, const JobOptions& options, JobDeps deps,
           uint64_t epoch, std::string owner);
  // Returns true when the rank's epoch was adopted (must be persisted).
  bool ApplyRegisterLocked(const dynmo::v1::RegisterRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // One rank's upstream message, by reference: a Session's report or ack,
  // or one RankMessage of a HostBatch. Exactly one of report / ack is set.
  struct Upstream {
    int rank;
    const dynmo::v1::IterationReport* report;
    const dynmo::v1::PlanAck* ack;
  };
  // The one path of reports and acks: every message is checked before any
  // is applied, so a refused one changes nothing.
  absl::Status OnUpstream(absl::Span<const Upstream> messages);
  absl::Status CheckLocked(const Upstream& m) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // INVALID_ARGUMENT for an iteration beyond the window (iteration_window).
  absl::Status CheckIterationLocked(int64_t iteration) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // INVALID_ARGUMENT for registered epochs beyond the window (epoch_window).
  absl::Status CheckRegisterEpochsLocked(const dynmo::v1::RegisterRequest& r) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyReportLocked(int rank, const dynmo::v1::IterationReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyAckLocked(int rank, const dynmo::v1::PlanAck& ack)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::StatusOr<core::PipelineModel> ModelLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rebalancer's measures of the layout in force, and their metrics.
  void MeasureLocked(const core::PipelineModel& model)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rebalancer's measures (fresh or restored) into the job's metrics.
  void PublishMeasuresLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- Plan effects (job_plan_effects.cc) ----
  // Returns how many ranks and sessions it went to.
  std::pair<int, int> SendToParticipants(const dynmo::v1::CoordinatorMessage& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the (re)attached `ranks` of `sink` may have missed, one message per
  // kind for all of them (PlanProtocol::MissedMessages).
  void ResendInFlight(const std::shared_ptr<SessionSink>& sink,
                      absl::Span<const int> ranks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::StatusOr<dynmo::v1::Plan> IssueLocked(const Decision& decision,
                                              const std::string& reason,
                                              absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Carries out what the plan protocol asked for.
  void RunStepLocked(const PlanStep& step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CommitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A re-shaping plan's effects on the roster, the layout and the profile.
  void ReshapeLocked(const dynmo::v1::Reshape& reshape) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The layout becomes `plan`'s, the GPUs it releases go to the pool, the
  // job is persisted and the plan_applied event logged.
  void SwitchLayoutLocked(const dynmo::v1::Plan& plan, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A rank runs under `epoch`, newer than the job's applied one (reported,
  // or named in a re-registration): after a restart or a plan the
  // coordinator settled otherwise, the ranks are right. Applies the
  // committed plan of that epoch, or adopts the epoch and the layout (from
  // the plan's record, else from `registered`), aborting a plan in flight
  // that was made from the older layout.
  void AdoptAppliedLocked(int rank, uint64_t epoch,
                          const dynmo::v1::RegisterRequest* registered)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The parts job_record.h makes the job's messages from.
  JobParts PartsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PersistLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // NOT_FOUND once the job was deleted (Close); else marks activity.
  absl::Status CheckOpenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Persists after a settled plan; a failure becomes the decision note.
  void PersistSettledLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  const std::string owner_;
  JobDeps deps_;
  std::unique_ptr<JobMetrics> metrics_;

  mutable absl::Mutex mu_;
  SendQueue outbox_{&mu_};  // Queue and Close under mu_
  const JobOptions options_;
  RankRoster roster_ ABSL_GUARDED_BY(mu_);
  core::CostProfile profile_ ABSL_GUARDED_BY(mu_);
  JobLayout layout_ ABSL_GUARDED_BY(mu_);
  Rebalancer rebalancer_ ABSL_GUARDED_BY(mu_);
  PlanProtocol protocol_ ABSL_GUARDED_BY(mu_);
  int64_t reports_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_activity_ ABSL_GUARDED_BY(mu_) = absl::Now();
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_JOB_STATE_H_
