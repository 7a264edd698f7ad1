// JobState: one training job in the coordinator daemon — the shell around
// its JobMachine (job_machine.h), which holds and decides everything about
// the job without locks or I/O. The shell adds what a daemon needs: the
// lock that serialises the job, the order its downstream messages leave in
// (delivery_order.h), the state keeper the machine's record is committed to,
// the event log, the metrics, the pool released GPUs go to, and the job's
// lifetime (job_lifecycle.cc: deletion, reopening, idle time for expiry).
// Each call locks, hands the event to the machine (which has made its
// record durable where a message names an epoch), carries out the
// machine's effects, unlocks, then delivers the messages in its turn.
//
// Thread-safe: one mutex per job; lock order job -> pool -> keeper.
// Downstream messages are handed to the sinks after the job's lock is
// released, in the order the job produced them (delivery_order.h), grouped
// per sink: a
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
#include "coordinator/service/event_log.h"
#include "coordinator/job/job_machine.h"
#include "coordinator/service/metrics.h"
#include "coordinator/service/released_pool.h"
#include "coordinator/service/delivery_order.h"
#include "coordinator/job/session_sink.h"
#include "coordinator/service/state_store.h"
#include "dynmo/v1/agent.pb.h"
#include "dynmo/v1/operator.pb.h"
#include "dynmo/v1/state.pb.h"

namespace dynmo::service {

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

  // One rank's upstream messages (a Session's one at a time: the service
  // calls this), checked and applied under one lock.
  absl::Status OnUpstream(absl::Span<const UpstreamMessage> messages);
  // OnUpstream of one message.
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
  // Carries out what the machine asked for: closes and messages to
  // `delivery` (with a turn), events into the log, counters and measures
  // into the metrics, released GPUs into the pool.
  void CarryLocked(JobEffects& effects, Delivery* delivery)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The machine's measures into the job's metrics.
  void PublishMeasuresLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // NOT_FOUND once the job was deleted (Close); else marks activity.
  absl::Status CheckOpenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  const std::string owner_;
  JobDeps deps_;
  std::unique_ptr<JobMetrics> metrics_;

  mutable absl::Mutex mu_;
  DeliveryOrder delivery_order_;  // turns taken under mu_
  std::unique_ptr<JobMachine> machine_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_activity_ ABSL_GUARDED_BY(mu_) = absl::Now();
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_JOB_STATE_H_
