#include "coordinator/job/plan_convert.h"

namespace dynmo::service {

void SetPlanLayout(const Decision& d, dynmo::v1::Plan* plan) {
  for (int b : d.boundaries) plan->add_boundaries(b);
  for (int s : d.active_stages) plan->add_active_stages(s);
  for (int s : d.released_stages) plan->add_released_stages(s);
  for (const core::LayerMigration& m : d.migrations) {
    dynmo::v1::LayerMove* lm = plan->add_migrations();
    lm->set_layer(m.layer);
    lm->set_from_stage(m.from_stage);
    lm->set_to_stage(m.to_stage);
    lm->set_bytes(m.bytes);
    lm->set_round(m.round);
  }
  for (const core::CommSplit& c : d.split) {
    dynmo::v1::CommSplit* cs = plan->add_split();
    cs->set_stage(c.stage);
    cs->set_color(c.color);
    cs->set_key(c.key);
  }
  plan->set_migration_bytes(d.migration_bytes);
  plan->set_predicted_bottleneck_s(d.predicted_bottleneck_s);
  plan->set_previous_bottleneck_s(d.current_bottleneck_s);
  if (d.reshape.has_value()) {
    dynmo::v1::Reshape* r = plan->mutable_reshape();
    r->set_pipeline_size(d.reshape->pipeline_size);
    r->set_data_parallel_size(d.reshape->data_parallel);
    r->set_copy_bytes(d.reshape->copy_bytes);
    r->set_predicted_microbatches_per_s(d.reshape->microbatches_per_s);
    r->set_release_microbatches_per_s(d.reshape->release_microbatches_per_s);
    r->set_previous_microbatches_per_s(d.reshape->previous_microbatches_per_s);
  }
}

}  // namespace dynmo::service
