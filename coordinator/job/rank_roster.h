// RankRoster: the ranks of one job and the sessions that carry them. It
// knows the job's shape (stages x replicas x layers, the model fingerprint),
// which rank registered with which (stage, replica) coordinates, where each
// runs (host, device, memory), its session and the newest iteration it
// reported; the job's report progress (the newest iteration any rank
// reported, the newest a rank flagged as a model change, how many reports
// flagged one); and, given the job's active stages (sorted, from the layout in
// force), which ranks take part in plans. It refuses registrations that do
// not fit the shape or take another rank's coordinates, and sessions for
// ranks that are unknown, unregistered or carried by another host. It sends
// nothing: sessions it replaces are handed back for the owner to close.
//
// Thread-compatible: the owner (JobState) guards it with its lock.
#ifndef DYNMO_COORDINATOR_JOB_RANK_ROSTER_H_
#define DYNMO_COORDINATOR_JOB_RANK_ROSTER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/cost_profile.h"
#include "coordinator/job/session_sink.h"
#include "dynmo/v1/agent.pb.h"
#include "dynmo/v1/plan.pb.h"
#include "dynmo/v1/scheduler.pb.h"
#include "dynmo/v1/state.pb.h"

namespace dynmo::service {

struct JobShape {
  std::string job;
  int pipeline_size = 1;
  int data_parallel_size = 1;
  int num_layers = 1;
  std::string fingerprint;  // the model's; empty until a rank names one
  int64_t planned_iterations = 0;  // the largest a rank named; 0 = unknown
};

struct RosterRank {
  bool registered = false;
  int pipeline_rank = -1;
  int data_parallel_rank = -1;
  std::string host;
  int device = 0;
  int64_t memory_capacity_bytes = 0;
  int64_t memory_used_bytes = 0;  // newest report's measured stage memory
  int64_t last_iteration = -1;
  std::shared_ptr<SessionSink> sink;
  // Issued by the newest Register (random, 128 bits); a session must
  // present it. Not persisted: after a restart every rank registers again.
  std::string session_key;
};

// A session and those of its ranks a message is for.
struct SessionRanks {
  std::shared_ptr<SessionSink> sink;
  std::vector<int> ranks;
};

class RankRoster {
 public:
  // pipeline_size * data_parallel_size ranks, none registered.
  explicit RankRoster(JobShape shape);

  const JobShape& shape() const { return shape_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  bool Contains(int rank) const { return rank >= 0 && rank < size(); }
  // Precondition: Contains(rank).
  const RosterRank& at(int rank) const { return ranks_[static_cast<size_t>(rank)]; }
  RosterRank& at(int rank) { return ranks_[static_cast<size_t>(rank)]; }

  // Errors: FAILED_PRECONDITION for a registration of another shape or
  // model, coordinates taken by another rank, or a rank that moved;
  // NOT_FOUND for a rank outside the job.
  absl::Status CheckRegister(const dynmo::v1::RegisterRequest& request) const;
  // Records a registration that passed CheckRegister.
  void Register(const dynmo::v1::RegisterRequest& request);
  // The ranks of a restored record (registered, not connected).
  void Restore(const dynmo::v1::JobRecord& record);
  // A re-shaping plan applied (plan.proto's Reshape): the job is now
  // `pipeline_size` x `data_parallel_size` over the same ranks; rank r
  // becomes stage r / dp, replica r % dp. Sessions and keys are kept.
  // Precondition: pipeline_size * data_parallel_size == size().
  void Reshape(int pipeline_size, int data_parallel_size);
  // Writes the shape and the registered ranks into `record`.
  void ToRecord(dynmo::v1::JobRecord* record) const;

  // A one-rank session: NOT_FOUND outside the job, FAILED_PRECONDITION
  // before Register, PERMISSION_DENIED when `session_key` is not the one
  // the rank's newest Register issued.
  absl::Status CheckAttach(int rank, absl::string_view session_key) const;
  // A multiplexed session of `sink`'s host: as CheckAttach for each rank
  // (keys in the order of `ranks`; INVALID_ARGUMENT for a count that
  // differs), and ALREADY_EXISTS for a rank carried by a live session of
  // another host.
  absl::Status CheckAttachHost(absl::Span<const int> ranks,
                               absl::Span<const std::string> session_keys,
                               const SessionSink& sink) const;
  // The key the rank's newest Register issued.
  const std::string& session_key(int rank) const { return at(rank).session_key; }
  // Binds `ranks` to `sink`; returns the older sessions it replaced, each
  // once, in order.
  std::vector<std::shared_ptr<SessionSink>> Attach(
      absl::Span<const int> ranks, const std::shared_ptr<SessionSink>& sink);
  // Unbinds `sink` from those of `ranks` it still serves.
  void Detach(absl::Span<const int> ranks, const SessionSink* sink);
  int connected() const;

  // What a valid report of `rank` says about the rank: its newest
  // iteration, its capacity when reported, and its stage's measured memory
  // when `active` (a released stage holds no layers); and about the job:
  // its newest iteration and, when `model_changed` (the report's flag, or
  // a speed the report moved), a model change at the report's iteration.
  void RecordReport(int rank, const dynmo::v1::IterationReport& report,
                    bool active, bool model_changed);
  // The newest iteration a rank reported (a restored record's until the
  // first report after RestoreProgress or OnResumed); -1: none.
  int64_t newest_iteration() const { return newest_iteration_; }
  // The newest iteration reported since this coordinator started; -1 while
  // the one shown is a restored one. What the iteration window is measured
  // from.
  int64_t reported_iteration() const { return restored_ ? -1 : newest_iteration_; }
  // The newest iteration a report flagged as a model change (-1: none).
  int64_t model_changed_iteration() const { return model_changed_iteration_; }
  // How many reports flagged a model change since this coordinator started.
  int64_t model_changes() const { return model_changes_; }
  // A restarted job's saved newest iteration, shown until the first report.
  void RestoreProgress(int64_t last_iteration);
  // The job restarted from older state (a checkpoint): its iterations start
  // again lower, so the next report's iteration is the newest, and no model
  // change is known.
  void OnResumed();
  // An ack of `rank` sent at `iteration`.
  void RecordAck(int rank, int64_t iteration);

  // Whether `stage` is one of `active` (sorted).
  static bool IsActiveStage(absl::Span<const int> active, int stage);
  // A registered rank of an active stage, or one not registered yet (every
  // active rank must show up).
  bool Participates(int rank, absl::Span<const int> active) const;
  int CountParticipants(absl::Span<const int> active) const;
  // The registered active ranks without a session (when `need_session`),
  // and -1 when some active ranks never registered.
  std::vector<int> MissingParticipants(absl::Span<const int> active,
                                       bool need_session) const;
  // FAILED_PRECONDITION naming MissingParticipants(active, true) unless
  // every active rank is registered and has a session.
  absl::Status CheckConnected(absl::Span<const int> active) const;
  // True when every registered active rank reported iteration >= `iteration`.
  bool ReportedSince(absl::Span<const int> active, int64_t iteration) const;
  // One entry per session carrying participating ranks, in rank order.
  // Every live session with the ranks it carries, each sink once; unbinds
  // them all (the job is going away).
  std::vector<SessionRanks> DetachAll();
  std::vector<SessionRanks> ParticipantSessions(
      absl::Span<const int> active) const;

  // Per active stage: the smallest reported capacity and the largest newest
  // measured use over its replicas. O(ranks + stages).
  std::vector<core::StageMemoryReport> StageMemory(
      absl::Span<const int> active) const;
  // The GPUs of the stages `plan` releases, as the pool records them.
  std::vector<dynmo::v1::ReleasedGpu> ReleasedBy(const dynmo::v1::Plan& plan,
                                                 absl::Time now) const;

  // The registered ranks of each stage, in rank order.
  std::vector<std::vector<int>> RegisteredByStage() const;

 private:
  absl::Status CheckKey(int rank, absl::string_view key) const;

  JobShape shape_;
  std::vector<RosterRank> ranks_;
  int64_t newest_iteration_ = -1;
  bool restored_ = false;  // newest_iteration_ is RestoreProgress's
  int64_t model_changed_iteration_ = -1;
  int64_t model_changes_ = 0;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_RANK_ROSTER_H_
