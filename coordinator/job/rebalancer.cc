#include "coordinator/job/rebalancer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cost_noise.h"

namespace dynmo::service {

Rebalancer::Rebalancer(const Policy& policy, const AutoOptions& auto_options)
    : policy_(policy), auto_options_(auto_options), gate_(auto_options) {}

void Rebalancer::OnResumed() {
  last_decision_iteration_ = -1;
  gate_ = AutoGate(auto_options_);
  rearmed_ = true;
}

void Rebalancer::RestoreProgress(const dynmo::v1::JobProgress& p) {
  considered_reports_ = p.reports();
  measures_.imbalance = p.imbalance();
  measures_.bottleneck = p.bottleneck_s();
  measures_.lower_bound = p.lower_bound_s();
  measures_.loads.assign(p.stage_load_s().begin(), p.stage_load_s().end());
  bubble_ = p.bubble_ratio();
}

void Rebalancer::SaveProgress(dynmo::v1::JobProgress* p) const {
  p->set_imbalance(measures_.imbalance);
  p->set_bottleneck_s(measures_.bottleneck);
  p->set_lower_bound_s(measures_.lower_bound);
  for (double l : measures_.loads) p->add_stage_load_s(l);
  p->set_bubble_ratio(bubble_);
}

bool Rebalancer::TakeDirty(int64_t reports) {
  const bool dirty = rearmed_ || reports != considered_reports_;
  rearmed_ = false;
  considered_reports_ = reports;
  return dirty;
}

void Rebalancer::Measure(const core::PipelineModel& model,
                         const JobLayout& layout) {
  if (!core::ValidateBoundaries(layout.boundaries,
                                static_cast<int>(model.layers.size()),
                                static_cast<int>(model.stages.size()))
           .ok()) {
    return;
  }
  measures_ = core::Summarize(model, layout.boundaries);
  absl::StatusOr<double> bubble = core::PredictedBubbleRatio(
      model, layout.boundaries, layout.schedule, layout.microbatches);
  bubble_ = bubble.ok() ? *bubble : 0;
}

std::optional<Proposal> Rebalancer::Consider(const RebalanceContext& context) {
  const bool model_changed = context.model_changes > decided_model_changes_;
  const TriggerCall call = EvaluateTrigger(
      policy_.trigger,
      TriggerState{context.newest_iteration - last_decision_iteration_, model_changed,
                   model_changed && context.changed_costs_complete});
  if (!call.note.empty()) note_ = call.note;
  if (!call.decide) return std::nullopt;
  if (!context.all_connected) {
    note_ = "waiting for every active rank to connect";
    return std::nullopt;  // keep the trigger armed
  }
  if (policy_.trigger.kind == Trigger::Kind::kAuto && context.speed_warming) {
    note_ = "a rank's speed is still being probed: waiting for it";
    return std::nullopt;  // keep the trigger armed
  }
  if (policy_.trigger.kind == Trigger::Kind::kAuto && context.speed_rising) {
    note_ = "a rank's speed probes came in faster: waiting for them to confirm a change";
    return std::nullopt;  // keep the trigger armed
  }
  if (policy_.trigger.kind == Trigger::Kind::kAuto && context.step_time_pending) {
    note_ = "measuring the current layout's step time: waiting for it";
    return std::nullopt;  // keep the trigger armed
  }
  last_decision_iteration_ = context.newest_iteration;
  decided_model_changes_ = context.model_changes;
  // Each layer's cost scatter, read once: the near-tie tolerance and the
  // auto gate's gain noise both price it.
  const std::vector<double> layer_noise = context.profile.LayerNoise();
  absl::StatusOr<Decision> d =
      Decide(context.model, context.layout, context.full_stages, context.data_parallel,
             context.rank_speeds, context.measured_iteration_s,
             std::min(auto_options_.max_near_tie,
                      auto_options_.near_tie_sigmas *
                          core::StageRelativeNoise(context.model, layer_noise)));
  if (!d.ok()) {
    note_ = absl::StrCat("decision failed: ", d.status().message());
    return std::nullopt;
  }
  if (!d->changes_layout) {
    gate_.Observe(AutoVerdict{}, context.newest_iteration);
    note_ = "layout already optimal";
    return std::nullopt;
  }
  if (policy_.trigger.kind == Trigger::Kind::kAuto &&
      !AutoGatePasses(context, *d, layer_noise)) {
    return std::nullopt;
  }
  std::string reason = call.reason + (d->reshape.has_value()          ? "+reshape"
                                     : d->released_stages.empty() ? ""
                                                                  : "+repack");
  return Proposal{*std::move(d), std::move(reason)};
}

bool Rebalancer::AutoGatePasses(const RebalanceContext& context, const Decision& d,
                                std::vector<double> layer_noise) {
  if (context.noise_inflation > 1) {
    const double scale = std::sqrt(context.noise_inflation);
    for (double& sd : layer_noise) sd *= scale;
  }
  AutoInput ai;
  ai.current_bottleneck_s = d.previous_bottleneck_s;
  ai.candidate_bottleneck_s = d.predicted_bottleneck_s;
  ai.current_stage_s = d.previous_stage_s;
  ai.candidate_stage_s = d.predicted_stage_s;
  ai.migration_bytes = d.migration_bytes;
  ai.microbatches = context.layout.microbatches;
  ai.releases_gpus = !d.released_stages.empty();
  ai.iterations_left = context.iterations_left;
  ai.min_relative_gain = context.min_relative_gain;
  if (d.reshape.has_value()) {
    // The candidate's stages on the slowest device (the noisier reading).
    core::PipelineModel candidate = context.model;
    core::StageSpec slowest = context.model.stages.front();
    for (const core::StageSpec& st : context.model.stages) {
      slowest.speed = std::min(slowest.speed, st.speed);
    }
    candidate.stages.assign(static_cast<size_t>(d.reshape->pipeline_size), slowest);
    absl::StatusOr<double> noise = core::ReshapeGainNoise(
        context.model, candidate, layer_noise, context.layout.boundaries,
        d.boundaries,
        static_cast<double>(context.data_parallel) / d.reshape->data_parallel_size);
    if (noise.ok()) ai.gain_noise_s = *noise;
  } else if (!ai.releases_gpus) {
    absl::StatusOr<double> noise =
        core::GainNoise(context.model, layer_noise,
                        context.layout.boundaries, d.boundaries);
    if (noise.ok()) ai.gain_noise_s = *noise;
  }
  const AutoVerdict v = EvaluateAuto(auto_options_, ai);
  note_ = v.why;
  // A model change ends a plan's cool-down for a job that re-balances in
  // place (the default); a re-packing job keeps it: there the change's
  // first plans weigh GPU-hours against throughput on freshly re-measured
  // costs, and an earlier one cost the what-if sweep's release cells up to
  // 0.5% of tokens/s.
  const int64_t settled_change =
      context.changed_costs_complete && !policy_.repack ? context.model_changed_iteration : -1;
  return gate_.Observe(v, context.newest_iteration, settled_change);
}

absl::StatusOr<Decision> Rebalancer::Decide(const core::PipelineModel& model,
                                            const JobLayout& layout,
                                            int full_stages, int data_parallel,
                                            const std::vector<double>& rank_speeds,
                                            double measured_iteration_s,
                                            double near_tie) {
  const auto start = std::chrono::steady_clock::now();
  DecisionInput in;
  in.model = model;
  in.active_stages = layout.active_stages;
  in.current = layout.boundaries;
  in.policy = policy_;
  in.full_stages = full_stages;
  in.data_parallel = data_parallel;
  in.microbatches = layout.microbatches;
  in.schedule = layout.schedule;
  in.data_parallel_spec = auto_options_.data_parallel;
  in.rank_speeds = rank_speeds;
  in.near_tie = near_tie;
  in.measured_iteration_s = measured_iteration_s;
  absl::StatusOr<Decision> d = service::Decide(in);
  latencies_s_.push_back(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return d;
}

absl::StatusOr<std::optional<Proposal>> Rebalancer::DecideNow(
    const core::PipelineModel& model, const JobLayout& layout, int full_stages,
    int data_parallel, const std::vector<double>& rank_speeds, double measured_iteration_s,
    std::string* detail) {
  absl::StatusOr<Decision> d =
      Decide(model, layout, full_stages, data_parallel, rank_speeds, measured_iteration_s);
  if (!d.ok()) return d.status();
  if (!d->changes_layout) {
    *detail = absl::StrCat("layout already optimal for balancer ",
                           core::PartitionMethodName(policy_.balancer),
                           policy_.repack ? " with re-packing" : "");
    return std::optional<Proposal>();
  }
  std::string reason = d->reshape.has_value()          ? "operator+reshape"
                       : d->released_stages.empty() ? "operator"
                                                    : "operator+repack";
  return std::optional<Proposal>(Proposal{*std::move(d), std::move(reason)});
}

void Rebalancer::OnPlanIssued(int64_t iteration) { gate_.OnPlanIssued(iteration); }

}  // namespace dynmo::service
