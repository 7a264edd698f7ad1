// The replay's inner parts (job_replay.h): the simulated ranks, the grid
// they run, and the Replay that drives a ReplayTarget record by record.
// job_replay_run.cc drives (registration, reports, plan answers, switches);
// job_replay_pricing.cc prices (true speeds, iteration costs, the oracle,
// the elastic bounds). Internal to coordinator/job; thread-compatible.
#ifndef DYNMO_COORDINATOR_JOB_JOB_REPLAY_RUN_H_
#define DYNMO_COORDINATOR_JOB_JOB_REPLAY_RUN_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/pipeline_sim.h"
#include "core/probe_cadence.h"
#include "core/reshape.h"
#include "coordinator/job/job_replay.h"

namespace dynmo::service::replay_internal {

using dynmo::v1::CoordinatorMessage;
using dynmo::v1::PlanAck;

// One simulated rank's session: what the coordinator sent it.
class Inbox : public SessionSink {
 public:
  void SendTo(absl::Span<const int> /*ranks*/, std::shared_ptr<const CoordinatorMessage> message) override {
    absl::MutexLock lock(&mu_);
    messages_.push_back(std::move(message));
  }
  void Close(const absl::Status&) override {}
  std::vector<std::shared_ptr<const CoordinatorMessage>> Take() {
    absl::MutexLock lock(&mu_);
    return std::move(messages_);
  }

 private:
  absl::Mutex mu_;
  std::vector<std::shared_ptr<const CoordinatorMessage>> messages_ ABSL_GUARDED_BY(mu_);
};

// A rank as its agent would behave: holds a prepared plan, switches at its
// apply iteration once committed.
struct SimRank {
  int pipeline_rank = 0;
  int replica = 0;
  uint64_t applied_epoch = 0;
  bool released = false;
  std::optional<dynmo::v1::Plan> held;
  bool committed = false;
  std::shared_ptr<Inbox> inbox = std::make_shared<Inbox>();
  // When it probes, as dynmo-train's ranks do; and the layers it held when
  // it last reported (a change restarts the cadence's pace).
  core::ProbeCadence cadence;
  int first_layer = -1, end_layer = -1;
};

// The grid the ranks run.
struct Grid {
  core::Boundaries boundaries;
  std::vector<int> active_stages;
  int dp = 1;
};

inline absl::Status AtIter(int64_t iter, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("iteration ", iter, ": ", status.message()));
}

inline PlanAck Ack(uint64_t epoch, PlanAck::State state, int64_t iteration) {
  PlanAck a;
  a.set_epoch(epoch);
  a.set_state(state);
  a.set_iteration(iteration);
  return a;
}

class Replay {
 public:
  Replay(const core::Trace& trace, const JobReplayConfig& config, ReplayTarget* target)
      : trace_(trace), config_(config), target_(target) {}

  absl::StatusOr<JobReplayResult> Run();

 private:
  // Every inbox's messages, answered as agents do, until none is left.
  absl::Status Drain(int64_t iteration);
  // Ranks holding a committed plan due at `iteration` switch to it.
  absl::Status Switch(int64_t iteration);
  // One iteration of `layers` on `grid` whose stage i holds `stage_ranks[i]`
  // at the ranks' true speeds at `iter`.
  absl::StatusOr<double> Cost(const std::vector<core::LayerCost>& layers, const Grid& grid,
                              const std::vector<std::vector<int>>& stage_ranks,
                              int64_t iter) const;
  // The true speed of `rank` at `iter` (config stragglers).
  double TrueSpeed(int rank, int64_t iter) const;
  // `layers` on stages that hold `stage_ranks`, each at its slowest rank's
  // true speed at `iter`.
  core::PipelineModel SpeedModel(const std::vector<core::LayerCost>& layers,
                                 const std::vector<std::vector<int>>& stage_ranks,
                                 int64_t iter) const;
  // The ranks of each active stage of the grid in force / of static's.
  std::vector<std::vector<int>> RanksByStage() const;
  std::vector<std::vector<int>> StaticRanksByStage() const;
  // Record `layers` at `iter` on its own optimum over the starting grid
  // (whose stage i holds `static_ranks[i]`): what it costs, and the optimum.
  absl::StatusOr<std::pair<double, core::Boundaries>> OracleCost(
      const std::vector<core::LayerCost>& layers,
      const std::vector<std::vector<int>>& static_ranks, int64_t iter) const;
  // The bound of the elastic mode in force over the records replayed.
  absl::Status ElasticBounds(std::vector<std::vector<core::LayerCost>> records);
  // One replica's pipeline of `model` on `grid`, simulated.
  absl::StatusOr<core::SimResult> Simulate(const core::PipelineModel& model,
                                           const Grid& grid) const;
  // Imbalance and bubble ratio of one replica's pipeline on `grid`.
  absl::StatusOr<std::pair<double, double>> Shape(
      const std::vector<core::LayerCost>& layers, const Grid& grid) const;
  ReplayedPlan* PlanOf(uint64_t epoch);

  const core::Trace& trace_;
  const JobReplayConfig& config_;
  ReplayTarget* target_;
  core::ShapeSpec spec_;
  std::vector<SimRank> ranks_;
  Grid grid_;
  int64_t last_iteration_ = 0;
  double pause_s_ = 0;  // migration pause of the plan applied before this record
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
  JobReplayResult result_;
};

}  // namespace dynmo::service::replay_internal

#endif  // DYNMO_COORDINATOR_JOB_JOB_REPLAY_RUN_H_
