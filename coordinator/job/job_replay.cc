#include "coordinator/job/job_replay.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/core/measures.h"
#include "coordinator/core/partition.h"
#include "coordinator/core/stage_program.h"
#include "coordinator/core/rebalance_trigger.h"
#include "coordinator/core/reshape.h"
#include "coordinator/core/stage_program.h"

namespace dynmo::service {
namespace {

using dynmo::v1::CoordinatorMessage;
using dynmo::v1::PlanAck;

// One simulated rank's session: what the coordinator sent it.
class Inbox : public SessionSink {
 public:
  void Send(std::shared_ptr<const CoordinatorMessage> message) override {
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
};

// The grid the ranks run.
struct Grid {
  core::Boundaries boundaries;
  std::vector<int> active_stages;
  int dp = 1;
};

absl::Status AtIter(int64_t iter, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("iteration ", iter, ": ", status.message()));
}

PlanAck Ack(uint64_t epoch, PlanAck::State state, int64_t iteration) {
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
  // The optimum of `layers` over static's grid at the speeds of `iter`.
  // Record `layers` at `iter` on its own optimum over the starting grid:
  // what it costs, and the optimum.
  absl::StatusOr<std::pair<double, core::Boundaries>> OracleCost(
      const std::vector<core::LayerCost>& layers, int64_t iter) const;
  // The bound of the elastic mode in force over the records replayed.
  absl::Status ElasticBounds(std::vector<std::vector<core::LayerCost>> records);
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

ReplayedPlan* Replay::PlanOf(uint64_t epoch) {
  for (ReplayedPlan& p : result_.plans) {
    if (p.epoch == epoch) return &p;
  }
  return nullptr;
}

absl::Status Replay::Drain(int64_t iteration) {
  for (bool any = true; any;) {
    any = false;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      SimRank& rank = ranks_[r];
      for (const auto& m : rank.inbox->Take()) {
        any = true;
        if (rank.released) continue;
        std::optional<PlanAck> ack;
        if (m->has_prepare()) {
          const dynmo::v1::Plan& plan = m->prepare();
          rank.held = plan;
          rank.committed = plan.commit_with_prepare();
          ack = Ack(plan.epoch(), PlanAck::PREPARED, iteration);
          if (PlanOf(plan.epoch()) == nullptr) {
            ReplayedPlan p;
            p.epoch = plan.epoch();
            p.decided_iteration = iteration;
            p.apply_iteration = plan.apply_iteration();
            p.reason = plan.reason();
            p.outcome = "in flight";
            p.boundaries.assign(plan.boundaries().begin(), plan.boundaries().end());
            p.active_stages.assign(plan.active_stages().begin(), plan.active_stages().end());
            p.pp = plan.has_reshape() ? plan.reshape().pipeline_size()
                                      : plan.active_stages_size();
            p.dp = plan.has_reshape() ? plan.reshape().data_parallel_size() : grid_.dp;
            p.migration_bytes = plan.migration_bytes();
            result_.plans.push_back(std::move(p));
          }
        } else if (m->has_commit()) {
          if (rank.held && rank.held->epoch() == m->commit().epoch()) rank.committed = true;
        } else if (m->has_abort()) {
          if (rank.held && rank.held->epoch() == m->abort().epoch()) {
            rank.held.reset();
            rank.committed = false;
          }
          if (ReplayedPlan* p = PlanOf(m->abort().epoch()); p != nullptr) {
            if (p->outcome == "in flight") p->outcome = "aborted";
          }
        }
        if (ack) {
          const UpstreamMessage up[] = {{static_cast<int>(r), nullptr, &*ack}};
          if (absl::Status s = target_->Upstream(up, now_); !s.ok()) {
            return AtIter(iteration, s);
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Replay::Switch(int64_t iteration) {
  std::optional<dynmo::v1::Plan> due;
  for (const SimRank& rank : ranks_) {
    if (!rank.released && rank.held && rank.committed &&
        rank.held->apply_iteration() <= iteration) {
      due = rank.held;
      break;
    }
  }
  if (!due) return absl::OkStatus();
  const dynmo::v1::Plan& plan = *due;
  // Positions among the active ranks before the plan (plan.proto's Reshape).
  const int old_dp = grid_.dp;
  Grid next;
  next.boundaries.assign(plan.boundaries().begin(), plan.boundaries().end());
  next.active_stages.assign(plan.active_stages().begin(), plan.active_stages().end());
  next.dp = plan.has_reshape() ? plan.reshape().data_parallel_size() : old_dp;
  std::vector<int> switched;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    SimRank& rank = ranks_[r];
    if (rank.released) continue;
    if (plan.has_reshape()) {
      const auto at = std::find(grid_.active_stages.begin(), grid_.active_stages.end(),
                                rank.pipeline_rank);
      const int p = static_cast<int>(at - grid_.active_stages.begin()) * old_dp + rank.replica;
      rank.pipeline_rank = p / next.dp;
      rank.replica = p % next.dp;
    } else if (std::find(next.active_stages.begin(), next.active_stages.end(),
                         rank.pipeline_rank) == next.active_stages.end()) {
      rank.released = true;
    }
    rank.applied_epoch = plan.epoch();
    rank.held.reset();
    rank.committed = false;
    switched.push_back(static_cast<int>(r));
  }
  grid_ = std::move(next);
  if (config_.migration_bandwidth_bytes_per_s > 0) {
    const double s =
        static_cast<double>(plan.migration_bytes()) / config_.migration_bandwidth_bytes_per_s;
    result_.migration_s += s;
    result_.dynamic_total_s += s;
    pause_s_ += s;
  }
  if (ReplayedPlan* p = PlanOf(plan.epoch()); p != nullptr) p->outcome = "applied";
  const PlanAck applied = Ack(plan.epoch(), PlanAck::APPLIED, last_iteration_);
  for (int r : switched) {
    const UpstreamMessage up[] = {{r, nullptr, &applied}};
    if (absl::Status s = target_->Upstream(up, now_); !s.ok()) return AtIter(iteration, s);
  }
  return absl::OkStatus();
}

double Replay::TrueSpeed(int rank, int64_t iter) const {
  double speed = 1;
  for (const SpeedChange& c : config_.stragglers) {
    if (c.rank == rank && iter >= c.from_iteration &&
        (c.to_iteration < 0 || iter < c.to_iteration)) {
      speed = std::min(speed, c.speed);
    }
  }
  return speed;
}

std::vector<std::vector<int>> Replay::RanksByStage() const {
  std::vector<std::vector<int>> out(grid_.active_stages.size());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_[r].released) continue;
    const auto at = std::find(grid_.active_stages.begin(), grid_.active_stages.end(),
                              ranks_[r].pipeline_rank);
    if (at != grid_.active_stages.end()) {
      out[static_cast<size_t>(at - grid_.active_stages.begin())].push_back(static_cast<int>(r));
    }
  }
  return out;
}

std::vector<std::vector<int>> Replay::StaticRanksByStage() const {
  std::vector<std::vector<int>> out(static_cast<size_t>(config_.pp));
  for (int r = 0; r < config_.pp * config_.dp; ++r) {
    out[static_cast<size_t>(r / config_.dp)].push_back(r);
  }
  return out;
}

core::PipelineModel Replay::SpeedModel(const std::vector<core::LayerCost>& layers,
                                      const std::vector<std::vector<int>>& stage_ranks,
                                      int64_t iter) const {
  core::PipelineModel model;
  model.layers = layers;
  for (const std::vector<int>& ranks : stage_ranks) {
    core::StageSpec st;
    for (int r : ranks) st.speed = std::min(st.speed, TrueSpeed(r, iter));
    model.stages.push_back(st);
  }
  return model;
}

absl::StatusOr<double> Replay::Cost(const std::vector<core::LayerCost>& layers,
                                    const Grid& grid,
                                    const std::vector<std::vector<int>>& stage_ranks,
                                    int64_t iter) const {
  absl::StatusOr<core::ShapeCost> c = core::CostOfGrid(
      layers, spec_,
      core::Grid{static_cast<int>(grid.active_stages.size()), grid.dp, grid.boundaries});
  if (!c.ok()) return c.status();
  if (config_.stragglers.empty()) return c->iteration_s;
  // Each stage at its slowest replica's speed; the all-reduce as priced.
  const core::PipelineModel model = SpeedModel(layers, stage_ranks, iter);
  core::SimConfig sim;
  sim.schedule = spec_.schedule;
  sim.microbatches = std::max(1, spec_.global_microbatches / grid.dp);
  sim.stages = core::StagePassTimesFor(model, grid.boundaries);
  absl::StatusOr<core::SimResult> run = core::SimulatePipeline(sim);
  if (!run.ok()) return run.status();
  return run->iteration_time_s + c->allreduce_s;
}

absl::StatusOr<std::pair<double, core::Boundaries>> Replay::OracleCost(
    const std::vector<core::LayerCost>& layers, int64_t iter) const {
  const std::vector<std::vector<int>> stage_ranks = StaticRanksByStage();
  const core::PipelineModel model = SpeedModel(layers, stage_ranks, iter);
  core::PartitionOptions po;
  po.method = core::PartitionMethod::kOptimal;
  absl::StatusOr<core::PartitionResult> best = core::Partition(model, po);
  if (!best.ok()) return best.status();
  Grid g;
  g.boundaries = best->boundaries;
  for (int s = 0; s < config_.pp; ++s) g.active_stages.push_back(s);
  g.dp = config_.dp;
  absl::StatusOr<double> cost = Cost(layers, g, stage_ranks, iter);
  if (!cost.ok()) return cost.status();
  return std::make_pair(*cost, std::move(g.boundaries));
}

absl::Status Replay::ElasticBounds(std::vector<std::vector<core::LayerCost>> records) {
  const Policy& policy = config_.options.default_policy;
  if (!policy.repack) return absl::OkStatus();
  ElasticBoundsInput in;
  in.records = std::move(records);
  in.static_iteration_s = result_.static_iteration_s;
  if (!config_.stragglers.empty()) {
    for (int64_t iter : result_.record_iterations) {
      std::vector<double> speeds;
      for (int r = 0; r < config_.pp * config_.dp; ++r) speeds.push_back(TrueSpeed(r, iter));
      in.rank_speeds.push_back(std::move(speeds));
    }
  }
  in.spec = spec_;
  in.spec.device.capacity_bytes = config_.stage_capacity_bytes;
  in.pp = config_.pp;
  in.dp = config_.dp;
  if (policy.elastic == Elastic::kRelease) {
    absl::StatusOr<ReleaseBound> b = ReleaseGpuSecondsBound(in);
    if (!b.ok()) return b.status();
    result_.release_bound = *b;
  } else {
    absl::StatusOr<ReshapeBound> b = ReshapeSpeedBound(in);
    if (!b.ok()) return b.status();
    result_.reshape_bound = *b;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<double, double>> Replay::Shape(
    const std::vector<core::LayerCost>& layers, const Grid& grid) const {
  core::PipelineModel model;
  model.layers = layers;
  model.stages.assign(grid.active_stages.size(), core::StageSpec{});
  core::SimConfig sim;
  sim.schedule = spec_.schedule;
  sim.microbatches = std::max(1, spec_.global_microbatches / grid.dp);
  sim.stages = core::StagePassTimesFor(model, grid.boundaries);
  absl::StatusOr<core::SimResult> run = core::SimulatePipeline(sim);
  if (!run.ok()) return run.status();
  return std::make_pair(core::Imbalance(core::StageLoads(model, grid.boundaries)),
                        run->bubble_ratio);
}

absl::StatusOr<JobReplayResult> Replay::Run() {
  const int num_layers = static_cast<int>(trace_.front().layers.size());
  const int n = config_.pp * config_.dp;
  spec_.global_microbatches = config_.microbatches * config_.dp;
  spec_.schedule = core::ParseSchedule(config_.schedule).value_or(core::Schedule::k1F1B);
  spec_.data_parallel = config_.options.auto_options.data_parallel;
  std::unique_ptr<ReplayTarget> own;
  if (target_ == nullptr) {
    own = MachineTarget(ReplayRegistration(trace_, config_, 0), config_.options);
    target_ = own.get();
  }
  std::vector<dynmo::v1::RegisterRequest> registrations;
  for (int r = 0; r < n; ++r) registrations.push_back(ReplayRegistration(trace_, config_, r));
  std::vector<dynmo::v1::RegisterResponse> responses;
  if (absl::Status s = target_->Register(registrations, &responses); !s.ok()) return s;
  ranks_.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    ranks_[r].pipeline_rank = r / config_.dp;
    ranks_[r].replica = r % config_.dp;
    if (absl::Status s = target_->Attach(r, responses[r].session_key(), ranks_[r].inbox);
        !s.ok()) {
      return s;
    }
  }
  grid_.boundaries = core::PartitionUniform(num_layers, config_.pp);
  for (int s = 0; s < config_.pp; ++s) grid_.active_stages.push_back(s);
  grid_.dp = config_.dp;
  const Grid fixed = grid_;

  std::vector<core::LayerCost> previous = core::LayerCostsOf(trace_.front());
  std::vector<core::Boundaries> oracle_boundaries;  // per record, with `oracle`
  std::vector<std::vector<core::LayerCost>> oracle_records;
  for (const core::TraceRecord& record : trace_) {
    const int64_t iter = record.iter;
    if (absl::Status s = Switch(iter); !s.ok()) return s;
    std::vector<core::LayerCost> layers = core::LayerCostsOf(record);
    if (config_.bytes_per_param > 0) {
      for (core::LayerCost& l : layers) l.params = l.resident_bytes / config_.bytes_per_param;
    }
    absl::StatusOr<double> fixed_s = Cost(layers, fixed, StaticRanksByStage(), iter);
    if (!fixed_s.ok()) return AtIter(iter, fixed_s.status());
    absl::StatusOr<double> moving_s = Cost(layers, grid_, RanksByStage(), iter);
    if (!moving_s.ok()) return AtIter(iter, moving_s.status());
    absl::StatusOr<std::pair<double, double>> fixed_shape = Shape(layers, fixed);
    if (!fixed_shape.ok()) return AtIter(iter, fixed_shape.status());
    absl::StatusOr<std::pair<double, double>> moving_shape = Shape(layers, grid_);
    if (!moving_shape.ok()) return AtIter(iter, moving_shape.status());
    result_.mean_imbalance_static += fixed_shape->first;
    result_.mean_bubble_static += fixed_shape->second;
    result_.mean_imbalance_dynamic += moving_shape->first;
    result_.mean_bubble_dynamic += moving_shape->second;
    const int ranks_now = static_cast<int>(grid_.active_stages.size()) * grid_.dp;
    result_.static_total_s += *fixed_s;
    result_.dynamic_total_s += *moving_s;
    result_.record_iterations.push_back(iter);
    result_.static_iteration_s.push_back(*fixed_s);
    result_.dynamic_iteration_s.push_back(*moving_s + pause_s_);
    pause_s_ = 0;
    result_.static_gpu_s += *fixed_s * n;
    result_.dynamic_gpu_s += *moving_s * ranks_now;
    ++result_.iterations;
    now_ += absl::Seconds(*moving_s);
    if (config_.oracle) {
      absl::StatusOr<std::pair<double, core::Boundaries>> best = OracleCost(layers, iter);
      if (!best.ok()) return AtIter(iter, best.status());
      result_.oracle_total_s += best->first;
      result_.oracle_iteration_s.push_back(best->first);
      oracle_boundaries.push_back(std::move(best->second));
      const size_t lead = static_cast<size_t>(std::max(0, config_.options.plan_lead_iterations));
      double delayed_s = *fixed_s;
      if (oracle_boundaries.size() > lead) {
        Grid g = fixed;
        g.boundaries = oracle_boundaries[oracle_boundaries.size() - 1 - lead];
        absl::StatusOr<double> d = Cost(layers, g, StaticRanksByStage(), iter);
        if (!d.ok()) return AtIter(iter, d.status());
        delayed_s = *d;
      }
      result_.delayed_oracle_total_s += delayed_s;
      if (config_.options.default_policy.repack) oracle_records.push_back(layers);
    }

    const bool changed =
        core::RelativeTimeChange(previous, layers) > config_.change_threshold;
    previous = layers;
    // Every rank of an active stage reports its stage's layers.
    std::vector<dynmo::v1::IterationReport> reports;
    std::vector<int> from;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const SimRank& rank = ranks_[r];
      if (rank.released) continue;
      const auto at = std::find(grid_.active_stages.begin(), grid_.active_stages.end(),
                                rank.pipeline_rank);
      if (at == grid_.active_stages.end()) continue;
      const size_t stage = static_cast<size_t>(at - grid_.active_stages.begin());
      // A rank at speed v measures everything 1/v times as long.
      const double slow = 1.0 / TrueSpeed(static_cast<int>(r), iter);
      dynmo::v1::IterationReport report;
      report.set_iteration(iter);
      report.set_applied_epoch(rank.applied_epoch);
      if (config_.probe_every > 0 && iter % config_.probe_every == 0) {
        report.set_probe_s(config_.probe_s * slow);
      }
      report.set_model_changed(changed);
      if (config_.stage_capacity_bytes >= 0) {
        report.set_stage_memory_capacity_bytes(config_.stage_capacity_bytes);
      }
      for (int l = grid_.boundaries[stage]; l < grid_.boundaries[stage + 1]; ++l) {
        const core::TraceLayer& t = record.layers[static_cast<size_t>(l)];
        dynmo::v1::LayerSample* sample = report.add_layers();
        sample->set_layer(l);
        sample->set_fwd_s(t.fwd_s * slow);
        sample->set_bwd_s(t.bwd_s * slow);
        sample->set_wgrad_s(t.wgrad_s * slow);
        sample->set_resident_bytes(t.mem_bytes);
        sample->set_params(layers[static_cast<size_t>(l)].params);
      }
      reports.push_back(std::move(report));
      from.push_back(static_cast<int>(r));
    }
    std::vector<UpstreamMessage> up;
    for (size_t i = 0; i < reports.size(); ++i) up.push_back({from[i], &reports[i], nullptr});
    if (absl::Status s = target_->Upstream(up, now_); !s.ok()) return AtIter(iter, s);
    last_iteration_ = iter;
    if (absl::Status s = Drain(iter); !s.ok()) return s;
    target_->Tick(now_);
    if (absl::Status s = Drain(iter); !s.ok()) return s;
  }
  result_.speedup =
      result_.dynamic_total_s > 0 ? result_.static_total_s / result_.dynamic_total_s : 1;
  if (result_.oracle_total_s > 0) {
    result_.oracle_speedup = result_.static_total_s / result_.oracle_total_s;
    result_.delayed_oracle_speedup = result_.static_total_s / result_.delayed_oracle_total_s;
    if (absl::Status s = ElasticBounds(std::move(oracle_records)); !s.ok()) return s;
  }
  const double n_records = static_cast<double>(std::max(1, result_.iterations));
  result_.mean_imbalance_static /= n_records;
  result_.mean_imbalance_dynamic /= n_records;
  result_.mean_bubble_static /= n_records;
  result_.mean_bubble_dynamic /= n_records;
  result_.final_boundaries = grid_.boundaries;
  result_.final_active_stages = grid_.active_stages;
  result_.final_pp = static_cast<int>(grid_.active_stages.size());
  result_.final_dp = grid_.dp;
  return std::move(result_);
}

}  // namespace

absl::StatusOr<JobReplayResult> ReplayJob(const core::Trace& trace,
                                          const JobReplayConfig& config,
                                          ReplayTarget* target) {
  if (absl::Status s = core::ValidateTrace(trace); !s.ok()) return s;
  if (absl::Status s = ValidateJobReplayConfig(config); !s.ok()) return s;
  const int num_layers = static_cast<int>(trace.front().layers.size());
  if (config.pp > num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.pp, " stages cannot each hold a layer of a ", num_layers, "-layer trace"));
  }
  return Replay(trace, config, target).Run();
}

}  // namespace dynmo::service
