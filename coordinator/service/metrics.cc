#include "coordinator/service/metrics.h"

#include "absl/strings/str_cat.h"
#include "cli/program_info.h"

namespace dynmo::service {

CoordinatorMetrics::CoordinatorMetrics()
    : registry_(std::make_shared<prometheus::Registry>()) {
  auto& r = *registry_;
  stage_load_ = &prometheus::BuildGauge()
                     .Name("dynmo_stage_load_seconds")
                     .Help("Measured seconds per micro-batch of each active "
                           "pipeline stage under the current layout.")
                     .Register(r);
  rank_speed_ = &prometheus::BuildGauge()
                     .Name("dynmo_rank_speed")
                     .Help("Each rank's relative speed from its speed probe "
                           "(the fastest rank is 1; a stage runs at its "
                           "slowest replica's).")
                     .Register(r);
  imbalance_ = &prometheus::BuildGauge()
                    .Name("dynmo_imbalance_ratio")
                    .Help("Load imbalance (max - min) / mean of the stages.")
                    .Register(r);
  bottleneck_ = &prometheus::BuildGauge()
                     .Name("dynmo_bottleneck_seconds")
                     .Help("Slowest stage's seconds per micro-batch.")
                     .Register(r);
  lower_bound_ = &prometheus::BuildGauge()
                      .Name("dynmo_bottleneck_lower_bound_seconds")
                      .Help("No layout can have a bottleneck below this.")
                      .Register(r);
  bubble_ = &prometheus::BuildGauge()
                 .Name("dynmo_predicted_bubble_ratio")
                 .Help("Idle fraction the pipeline simulator predicts.")
                 .Register(r);
  gpus_ = &prometheus::BuildGauge()
               .Name("dynmo_gpus")
               .Help("GPUs of the job by state (active or released).")
               .Register(r);
  plans_ = &prometheus::BuildCounter()
                .Name("dynmo_plans_total")
                .Help("Plans by outcome (issued, applied, aborted).")
                .Register(r);
  migrated_ = &prometheus::BuildCounter()
                   .Name("dynmo_migrated_bytes_total")
                   .Help("Resident bytes moved by applied plans.")
                   .Register(r);
  reports_ = &prometheus::BuildCounter()
                  .Name("dynmo_reports_total")
                  .Help("Iteration reports received.")
                  .Register(r);
  predicted_gain_ = &prometheus::BuildGauge()
                         .Name("dynmo_plan_predicted_gain")
                         .Help("The newest measured plan's predicted step-time gain "
                               "(previous / predicted bottleneck - 1).")
                         .Register(r);
  realized_gain_ = &prometheus::BuildGauge()
                        .Name("dynmo_plan_realized_gain")
                        .Help("The newest measured plan's realized step-time gain "
                              "(median step before / after - 1).")
                        .Register(r);
  prediction_error_ =
      &prometheus::BuildHistogram()
           .Name("dynmo_plan_prediction_error")
           .Help("Realized minus predicted gain of each measured plan.")
           .Register(r)
           .Add({}, prometheus::Histogram::BucketBoundaries{
                        -0.2, -0.1, -0.05, -0.03, -0.01, 0.01, 0.03, 0.05, 0.1, 0.2});
  rpc_errors_ = &prometheus::BuildCounter()
                     .Name("dynmo_rpc_errors_total")
                     .Help("RPCs that ended with a non-OK status.")
                     .Register(r);
  prometheus::BuildGauge()
      .Name("dynmo_build_info")
      .Help("Always 1; the coordinator's version in the label.")
      .Register(r)
      .Add({{"version", cli::Version()}})
      .Set(1);
  state_commit_failures_ =
      &prometheus::BuildCounter()
           .Name("dynmo_state_commit_failures_total")
           .Help("Commits of the state dir that failed: the change was refused "
                 "and nothing was persisted (disk full, read-only, I/O error).")
           .Register(r)
           .Add({});
  quarantined_jobs_ =
      &prometheus::BuildGauge()
           .Name("dynmo_quarantined_jobs")
           .Help("Jobs whose record in the state dir is unusable (checksum, parse or "
                 "bounds): their ranks are refused with DATA_LOSS until an operator "
                 "deletes the job; every other job is served.")
           .Register(r)
           .Add({});
  watchers_fell_behind_ =
      &prometheus::BuildCounter()
           .Name("dynmo_watchers_fell_behind_total")
           .Help("WatchReleased streams ended with RESOURCE_EXHAUSTED because their "
                 "reader did not read a whole backlog (--watcher_backlog_events, "
                 "--watcher_backlog_bytes).")
           .Register(r)
           .Add({});
  sessions_without_hello_ =
      &prometheus::BuildCounter()
           .Name("dynmo_sessions_without_hello_total")
           .Help("Session and HostSession streams ended with DEADLINE_EXCEEDED because "
                 "their first message (hello) did not come within --hello_timeout_s.")
           .Register(r)
           .Add({});
  decision_latency_ =
      &prometheus::BuildHistogram()
           .Name("dynmo_decision_latency_seconds")
           .Help("Time to compute one rebalancing decision.")
           .Register(r)
           .Add({}, prometheus::Histogram::BucketBoundaries{
                        1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1,
                        0.3, 1});
}

void CoordinatorMetrics::RpcError(const std::string& method,
                                  const std::string& code) {
  rpc_errors_->Add({{"method", method}, {"code", code}}).Increment();
}

JobMetrics::JobMetrics(CoordinatorMetrics* owner, const std::string& job)
    : owner_(owner), job_(job) {
  imbalance_ = &owner->imbalance_->Add({{"job", job}});
  bottleneck_ = &owner->bottleneck_->Add({{"job", job}});
  lower_bound_ = &owner->lower_bound_->Add({{"job", job}});
  bubble_ = &owner->bubble_->Add({{"job", job}});
  gpus_active_ = &owner->gpus_->Add({{"job", job}, {"state", "active"}});
  gpus_released_ = &owner->gpus_->Add({{"job", job}, {"state", "released"}});
  issued_ = &owner->plans_->Add({{"job", job}, {"outcome", "issued"}});
  applied_ = &owner->plans_->Add({{"job", job}, {"outcome", "applied"}});
  aborted_ = &owner->plans_->Add({{"job", job}, {"outcome", "aborted"}});
  migrated_ = &owner->migrated_->Add({{"job", job}});
  reports_ = &owner->reports_->Add({{"job", job}});
  predicted_gain_ = &owner->predicted_gain_->Add({{"job", job}});
  realized_gain_ = &owner->realized_gain_->Add({{"job", job}});
}

void JobMetrics::PlanGain(double predicted, double realized, bool model_changed) {
  predicted_gain_->Set(predicted);
  realized_gain_->Set(realized);
  if (!model_changed) owner_->prediction_error_->Observe(realized - predicted);
}

JobMetrics::~JobMetrics() {
  absl::MutexLock lock(&mu_);
  for (const auto& [stage, gauge] : stage_loads_) owner_->stage_load_->Remove(gauge);
  for (const auto& [rank, gauge] : rank_speeds_) owner_->rank_speed_->Remove(gauge);
  owner_->imbalance_->Remove(imbalance_);
  owner_->bottleneck_->Remove(bottleneck_);
  owner_->lower_bound_->Remove(lower_bound_);
  owner_->bubble_->Remove(bubble_);
  owner_->gpus_->Remove(gpus_active_);
  owner_->gpus_->Remove(gpus_released_);
  owner_->plans_->Remove(issued_);
  owner_->plans_->Remove(applied_);
  owner_->plans_->Remove(aborted_);
  owner_->migrated_->Remove(migrated_);
  owner_->reports_->Remove(reports_);
  owner_->predicted_gain_->Remove(predicted_gain_);
  owner_->realized_gain_->Remove(realized_gain_);
}

void JobMetrics::SetStageLoads(absl::Span<const int> stages,
                               absl::Span<const double> loads) {
  absl::MutexLock lock(&mu_);
  // Re-packing shrinks the pipeline: drop the series of stages that left.
  for (auto it = stage_loads_.begin(); it != stage_loads_.end();) {
    bool present = false;
    for (int s : stages) present = present || s == it->first;
    if (present) {
      ++it;
    } else {
      owner_->stage_load_->Remove(it->second);
      it = stage_loads_.erase(it);
    }
  }
  for (size_t i = 0; i < stages.size() && i < loads.size(); ++i) {
    prometheus::Gauge*& g = stage_loads_[stages[i]];
    if (g == nullptr) {
      g = &owner_->stage_load_->Add(
          {{"job", job_}, {"stage", absl::StrCat(stages[i])}});
    }
    g->Set(loads[i]);
  }
}

void JobMetrics::SetRankSpeeds(absl::Span<const double> speeds) {
  absl::MutexLock lock(&mu_);
  for (size_t r = 0; r < speeds.size(); ++r) {
    prometheus::Gauge*& g = rank_speeds_[static_cast<int>(r)];
    if (g == nullptr) {
      g = &owner_->rank_speed_->Add({{"job", job_}, {"rank", absl::StrCat(r)}});
    }
    g->Set(speeds[r]);
  }
}

void JobMetrics::SetMeasures(double imbalance, double bottleneck_s,
                             double lower_bound_s, double bubble_ratio) {
  imbalance_->Set(imbalance);
  bottleneck_->Set(bottleneck_s);
  lower_bound_->Set(lower_bound_s);
  bubble_->Set(bubble_ratio);
}

void JobMetrics::SetGpus(int active, int released) {
  gpus_active_->Set(active);
  gpus_released_->Set(released);
}

}  // namespace dynmo::service
