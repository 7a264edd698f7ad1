// JobState: everything the coordinator knows about one training job, and the
// coordinator's side of the two-phase plan protocol (docs/protocol.md).
//
// Ranks register with their pipeline / data-parallel coordinates; each rank
// then reports the per-layer costs of its own stage's layers. JobState keeps
// one smoothed cost per (replica, layer) and, once every layer of every
// replica has been seen, combines the replicas with
// core::CombineReplicaProfiles (max per field: the slowest replica paces the
// step). Tick() evaluates the job's Policy and may issue a plan:
//
//   PREPARE(epoch, plan, apply_iteration) -> every participating rank
//   all ranks PREPARED                    -> COMMIT to every rank (persisted)
//   any FAILED / timeout / too late       -> ABORT to every rank (persisted)
//   APPLIED ack, or a report of an iteration >= apply_iteration that ran
//   under the plan's epoch                -> outcome applied; released GPUs
//                                            enter the ReleasedPool
//
// The epoch is committed to the StateKeeper before PREPARE leaves, so epochs
// never go backwards across kill -9. Thread-safe: one mutex per job; lock
// order job -> pool -> keeper. Downstream messages are queued under the
// job's lock and handed to the sinks after it is released, in order, grouped
// per sink: a multiplexed session (SessionSink shared by several ranks) gets
// one message per broadcast listing the ranks it is for.
#ifndef DYNMO_COORDINATOR_SERVICE_JOB_STATE_H_
#define DYNMO_COORDINATOR_SERVICE_JOB_STATE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "coordinator/core/boundaries.h"
#include "coordinator/core/cost_model.h"
#include "coordinator/core/cost_noise.h"
#include "coordinator/core/pipeline_sim.h"
#include "coordinator/service/decision.h"
#include "coordinator/service/metrics.h"
#include "coordinator/service/policy.h"
#include "coordinator/service/released_pool.h"
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
  JobState(const dynmo::v1::RegisterRequest& first, const JobOptions& options,
           JobDeps deps);
  // A job restored from the state dir. A plan that was still PREPARING is
  // aborted (no rank can have committed it); a COMMITTED one stays in flight
  // until reports or re-registrations resolve it.
  JobState(const dynmo::v1::JobRecord& record, const JobOptions& options,
           JobDeps deps);

  JobState(const JobState&) = delete;
  JobState& operator=(const JobState&) = delete;

  const std::string& name() const { return name_; }

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
  // Binds a registered rank's session; replaces (and closes) an older one
  // and re-sends whatever plan message the rank may have missed.
  absl::Status Attach(int rank, std::shared_ptr<SessionSink> sink);
  // Unbinds `sink` if it is still the rank's session.
  void Detach(int rank, const SessionSink* sink);
  // Binds several registered ranks to one multiplexed session, all or
  // nothing: NOT_FOUND for a rank outside the job, FAILED_PRECONDITION for
  // an unregistered one, ALREADY_EXISTS for a rank carried by a live session
  // of another host. Replaces (and closes) older sessions of these ranks and
  // re-sends the in-flight plan once for all of them.
  absl::Status AttachHost(absl::Span<const int> ranks,
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
  // The durable record (what the state dir holds for this job).
  dynmo::v1::JobRecord Record() const;
  // Writes the record to the keeper and commits.
  absl::Status Persist();

 private:
  struct Rank {
    bool registered = false;
    int pipeline_rank = -1;
    int data_parallel_rank = -1;
    std::string host;
    int device = 0;
    int64_t memory_capacity_bytes = 0;
    int64_t memory_used_bytes = 0;  // newest report's measured stage memory
    int64_t last_iteration = -1;
    uint64_t applied_epoch = 0;
    std::shared_ptr<SessionSink> sink;
    bool prepared = false;  // for the in-flight plan
  };

  absl::Status RegisterUnflushed(const dynmo::v1::RegisterRequest& request,
                                 dynmo::v1::RegisterResponse* response);
  absl::Status CheckRegisterLocked(const dynmo::v1::RegisterRequest& request)
      const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns true when the rank's epoch was adopted (must be persisted).
  bool ApplyRegisterLocked(const dynmo::v1::RegisterRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RegisterResponseLocked(int rank,
                              dynmo::v1::RegisterResponse* response) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckReportLocked(int rank,
                                 const dynmo::v1::IterationReport& report) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyReportLocked(int rank, const dynmo::v1::IterationReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckAckLocked(int rank, const dynmo::v1::PlanAck& ack) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyAckLocked(int rank, const dynmo::v1::PlanAck& ack)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AttachUnflushed(int rank, std::shared_ptr<SessionSink> sink);
  absl::Status OnReportUnflushed(int rank,
                                 const dynmo::v1::IterationReport& report);
  absl::Status OnAckUnflushed(int rank, const dynmo::v1::PlanAck& ack);
  void TickUnflushed(absl::Time now);
  absl::StatusOr<dynmo::v1::RebalanceResponse> RebalanceUnflushed(
      absl::Time now);
  // Downstream messages are queued under mu_ and sent by FlushSends after
  // it is released.
  void QueueSend(const std::shared_ptr<SessionSink>& sink,
                 std::vector<int> ranks,
                 const dynmo::v1::CoordinatorMessage& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QueueClose(const std::shared_ptr<SessionSink>& sink)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FlushSends() ABSL_LOCKS_EXCLUDED(mu_);

  void Init(const JobOptions& options) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsActiveStage(int stage) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Participates(int rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when every registered active rank reported iteration >= `iter`.
  bool ActiveRanksReportedSince(int64_t iter) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<int> MissingParticipants(bool need_session) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<core::PipelineModel> ModelLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Newest measured memory per active stage (max over its replicas).
  std::vector<int64_t> StageMemoryUsedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Standard error of each layer's smoothed time, the max over replicas.
  std::vector<double> LayerNoiseLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateMeasuresLocked(const core::PipelineModel& model)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Decision> DecideLocked(const core::PipelineModel& model)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<dynmo::v1::Plan> IssueLocked(const Decision& decision,
                                              const std::string& reason,
                                              absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CommitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishLocked(dynmo::v1::PlanOutcome outcome, const std::string& detail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendToParticipants(const dynmo::v1::CoordinatorMessage& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the (re)attached `ranks` of `sink` may have missed: the in-flight
  // PREPARE (and COMMIT) for the participating ones, or the ABORT of the
  // newest epoch; one message per kind for all of them.
  void ResendInFlight(const std::shared_ptr<SessionSink>& sink,
                      absl::Span<const int> ranks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  dynmo::v1::JobRecord RecordLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PersistLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  dynmo::v1::JobSummary SummaryLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  JobDeps deps_;
  std::unique_ptr<JobMetrics> metrics_;

  absl::Mutex send_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  struct PendingSend {
    std::shared_ptr<SessionSink> sink;
    std::vector<int> ranks;  // the ranks of `sink` it is for
    std::shared_ptr<const dynmo::v1::CoordinatorMessage> message;
  };
  std::vector<PendingSend> sends_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<SessionSink>> closes_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> has_sends_{false};  // sends_ or closes_ is non-empty
  JobOptions options_ ABSL_GUARDED_BY(mu_);
  int pipeline_size_ ABSL_GUARDED_BY(mu_) = 1;
  int data_parallel_size_ ABSL_GUARDED_BY(mu_) = 1;
  int num_layers_ ABSL_GUARDED_BY(mu_) = 1;
  std::string fingerprint_ ABSL_GUARDED_BY(mu_);
  int microbatches_ ABSL_GUARDED_BY(mu_) = 1;
  core::Schedule schedule_ ABSL_GUARDED_BY(mu_) = core::Schedule::k1F1B;
  Policy policy_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<AutoGate> gate_ ABSL_GUARDED_BY(mu_);

  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t applied_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  core::Boundaries boundaries_ ABSL_GUARDED_BY(mu_);
  std::vector<int> active_stages_ ABSL_GUARDED_BY(mu_);
  std::vector<Rank> ranks_ ABSL_GUARDED_BY(mu_);

  // Smoothed costs [replica][layer] and whether each was ever reported.
  std::vector<std::vector<core::LayerCost>> costs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<bool>> seen_ ABSL_GUARDED_BY(mu_);
  // Timing noise of each (replica, layer)'s fwd + bwd + wgrad samples.
  std::vector<std::vector<core::NoiseTracker>> noise_ ABSL_GUARDED_BY(mu_);
  int missing_ ABSL_GUARDED_BY(mu_) = 0;

  int64_t newest_iteration_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t last_decision_iteration_ ABSL_GUARDED_BY(mu_) = -1;
  bool model_changed_ ABSL_GUARDED_BY(mu_) = false;
  // The newest iteration a rank flagged "model changed". on-event decides
  // only once every active rank reported it or later: otherwise the plan
  // would mix one stage's new costs with another's stale ones.
  int64_t model_changed_iteration_ ABSL_GUARDED_BY(mu_) = -1;
  bool dirty_ ABSL_GUARDED_BY(mu_) = false;
  int64_t reports_ ABSL_GUARDED_BY(mu_) = 0;

  std::optional<dynmo::v1::PlanRecord> in_flight_ ABSL_GUARDED_BY(mu_);
  absl::Time in_flight_since_ ABSL_GUARDED_BY(mu_);
  int participants_ ABSL_GUARDED_BY(mu_) = 0;    // ranks that must prepare
  int prepared_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<dynmo::v1::PlanRecord> history_ ABSL_GUARDED_BY(mu_);

  // Measures of the current layout, refreshed by Tick.
  std::vector<double> loads_ ABSL_GUARDED_BY(mu_);
  double imbalance_ ABSL_GUARDED_BY(mu_) = 0;
  double bottleneck_ ABSL_GUARDED_BY(mu_) = 0;
  double lower_bound_ ABSL_GUARDED_BY(mu_) = 0;
  double bubble_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_decision_note_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_JOB_STATE_H_
