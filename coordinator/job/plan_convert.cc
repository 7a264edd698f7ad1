#include "coordinator/job/plan_convert.h"

namespace dynmo::service {

wire::Plan PlanOfDecision(const Decision& d) {
  wire::Plan plan;
  plan.boundaries = d.boundaries;
  plan.active_stages = d.active_stages;
  plan.released_stages = d.released_stages;
  plan.migrations = d.migrations;
  plan.split = d.split;
  plan.migration_bytes = d.migration_bytes;
  plan.predicted_bottleneck_s = d.predicted_bottleneck_s;
  plan.previous_bottleneck_s = d.current_bottleneck_s;
  if (d.reshape.has_value()) {
    plan.reshape = wire::Reshape{d.reshape->pipeline_size,
                                 d.reshape->data_parallel,
                                 d.reshape->copy_bytes,
                                 d.reshape->microbatches_per_s,
                                 d.reshape->release_microbatches_per_s,
                                 d.reshape->previous_microbatches_per_s};
  }
  return plan;
}

}  // namespace dynmo::service
