#include "wire/plan_codec.h"

namespace dynmo::wire {

Plan PlanFromProto(const dynmo::v1::Plan& p) {
  Plan plan;
  plan.job = p.job();
  plan.epoch = p.epoch();
  plan.apply_iteration = p.apply_iteration();
  plan.boundaries.assign(p.boundaries().begin(), p.boundaries().end());
  plan.active_stages.assign(p.active_stages().begin(), p.active_stages().end());
  plan.released_stages.assign(p.released_stages().begin(), p.released_stages().end());
  for (const dynmo::v1::LayerMove& m : p.migrations()) {
    plan.migrations.push_back({m.layer(), m.from_stage(), m.to_stage(), m.bytes(), m.round()});
  }
  for (const dynmo::v1::CommSplit& c : p.split()) {
    plan.split.push_back({c.stage(), c.color(), c.key()});
  }
  plan.migration_bytes = p.migration_bytes();
  plan.predicted_bottleneck_s = p.predicted_bottleneck_s();
  plan.previous_bottleneck_s = p.previous_bottleneck_s();
  plan.reason = p.reason();
  plan.decided_unix_nanos = p.decided_unix_nanos();
  plan.commit_with_prepare = p.commit_with_prepare();
  if (p.has_reshape()) {
    const dynmo::v1::Reshape& r = p.reshape();
    plan.reshape = Reshape{r.pipeline_size(),
                           r.data_parallel_size(),
                           r.copy_bytes(),
                           r.predicted_microbatches_per_s(),
                           r.release_microbatches_per_s(),
                           r.previous_microbatches_per_s()};
  }
  return plan;
}

std::optional<Plan> PlanFromProto(const std::optional<dynmo::v1::Plan>& proto) {
  if (!proto) return std::nullopt;
  return PlanFromProto(*proto);
}

void PlanToProto(const Plan& plan, dynmo::v1::Plan* p) {
  p->set_job(plan.job);
  p->set_epoch(plan.epoch);
  p->set_apply_iteration(plan.apply_iteration);
  for (int b : plan.boundaries) p->add_boundaries(b);
  for (int s : plan.active_stages) p->add_active_stages(s);
  for (int s : plan.released_stages) p->add_released_stages(s);
  for (const core::LayerMigration& m : plan.migrations) {
    dynmo::v1::LayerMove* lm = p->add_migrations();
    lm->set_layer(m.layer);
    lm->set_from_stage(m.from_stage);
    lm->set_to_stage(m.to_stage);
    lm->set_bytes(m.bytes);
    lm->set_round(m.round);
  }
  for (const core::CommSplit& c : plan.split) {
    dynmo::v1::CommSplit* cs = p->add_split();
    cs->set_stage(c.stage);
    cs->set_color(c.color);
    cs->set_key(c.key);
  }
  p->set_migration_bytes(plan.migration_bytes);
  p->set_predicted_bottleneck_s(plan.predicted_bottleneck_s);
  p->set_previous_bottleneck_s(plan.previous_bottleneck_s);
  p->set_reason(plan.reason);
  p->set_decided_unix_nanos(plan.decided_unix_nanos);
  p->set_commit_with_prepare(plan.commit_with_prepare);
  if (plan.reshape) {
    dynmo::v1::Reshape* r = p->mutable_reshape();
    r->set_pipeline_size(plan.reshape->pipeline_size);
    r->set_data_parallel_size(plan.reshape->data_parallel_size);
    r->set_copy_bytes(plan.reshape->copy_bytes);
    r->set_predicted_microbatches_per_s(plan.reshape->predicted_microbatches_per_s);
    r->set_release_microbatches_per_s(plan.reshape->release_microbatches_per_s);
    r->set_previous_microbatches_per_s(plan.reshape->previous_microbatches_per_s);
  }
}

}  // namespace dynmo::wire
