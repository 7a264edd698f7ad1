#include "coordinator/job/job_replay.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/measures.h"
#include "core/partition.h"
#include "core/rebalance_trigger.h"
#include "core/reshape.h"
#include "core/stage_program.h"
#include "coordinator/job/job_replay_run.h"

namespace dynmo::service {
namespace replay_internal {

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
  // The trainers' cadence, their five start probes included.
  core::ProbeCadenceOptions cadence;
  cadence.every = config_.probe_every;
  cadence.steady_every = config_.probe_steady_every;
  for (int r = 0; r < n; ++r) {
    ranks_[r].cadence = core::ProbeCadence(cadence);
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
  const std::vector<std::vector<int>> static_ranks = StaticRanksByStage();

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
    absl::StatusOr<double> fixed_s = Cost(layers, fixed, static_ranks, iter);
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
      absl::StatusOr<std::pair<double, core::Boundaries>> best =
          OracleCost(layers, static_ranks, iter);
      if (!best.ok()) return AtIter(iter, best.status());
      result_.oracle_total_s += best->first;
      result_.oracle_iteration_s.push_back(best->first);
      oracle_boundaries.push_back(std::move(best->second));
      const size_t lead = static_cast<size_t>(std::max(0, config_.options.plan_lead_iterations));
      double delayed_s = *fixed_s;
      if (oracle_boundaries.size() > lead) {
        Grid g = fixed;
        g.boundaries = oracle_boundaries[oracle_boundaries.size() - 1 - lead];
        absl::StatusOr<double> d = Cost(layers, g, static_ranks, iter);
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
      SimRank& rank = ranks_[r];
      if (rank.released) continue;
      const auto at = std::find(grid_.active_stages.begin(), grid_.active_stages.end(),
                                rank.pipeline_rank);
      if (at == grid_.active_stages.end()) continue;
      const size_t stage = static_cast<size_t>(at - grid_.active_stages.begin());
      // A rank at speed v measures everything 1/v times as long.
      const double slow = 1.0 / TrueSpeed(static_cast<int>(r), iter);
      dynmo::v1::IterationReport report;
      report.set_iteration(iter);
      // The iteration as the grid in force ran it (a switch's migration
      // included): what a trainer's step time would read, and what the
      // plans' realized gains are measured from, as live.
      report.set_iteration_s(*moving_s);
      report.set_applied_epoch(rank.applied_epoch);
      report.set_model_changed(changed);
      if (config_.stage_capacity_bytes >= 0) {
        report.set_stage_memory_capacity_bytes(config_.stage_capacity_bytes);
      }
      const int first = grid_.boundaries[stage], end = grid_.boundaries[stage + 1];
      double layer_s = 0;  // what the rank's layers took: the probe cadence's pace
      for (int l = first; l < end; ++l) {
        const core::TraceLayer& t = record.layers[static_cast<size_t>(l)];
        layer_s += (t.fwd_s + t.bwd_s) * slow;
        dynmo::v1::LayerSample* sample = report.add_layers();
        sample->set_layer(l);
        sample->set_fwd_s(t.fwd_s * slow);
        sample->set_bwd_s(t.bwd_s * slow);
        sample->set_wgrad_s(t.wgrad_s * slow);
        sample->set_resident_bytes(t.mem_bytes);
        sample->set_params(layers[static_cast<size_t>(l)].params);
      }
      const bool moved =
          rank.first_layer >= 0 && (first != rank.first_layer || end != rank.end_layer);
      rank.first_layer = first;
      rank.end_layer = end;
      if (rank.cadence.ShouldProbe(iter, layer_s, moved)) {
        report.set_probe_s(config_.probe_s * slow);
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
  for (const dynmo::v1::PlanRecord& h : target_->History()) {
    ReplayedPlan* p = PlanOf(h.plan().epoch());
    if (p == nullptr) continue;
    p->predicted_gain = h.predicted_gain();
    p->realized_gain = h.realized_gain();
    p->realized_spread = h.realized_spread();
    p->realized_samples = h.realized_samples();
    p->realized_model_changed = h.realized_model_changed();
  }
  result_.final_boundaries = grid_.boundaries;
  result_.final_active_stages = grid_.active_stages;
  result_.final_pp = static_cast<int>(grid_.active_stages.size());
  result_.final_dp = grid_.dp;
  return std::move(result_);
}

}  // namespace replay_internal

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
  return replay_internal::Replay(trace, config, target).Run();
}

}  // namespace dynmo::service
